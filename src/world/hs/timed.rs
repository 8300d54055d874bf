//! RISC-V on the timed platform (`Arch::RiscvHs`): the generic loop's
//! questions answered for harts with the H extension and the AIA, with the
//! same lowering as [`super::HsStepper`] (the instruction each guest event
//! becomes and whether it traps), now with time and costs
//! (calibration/riscv-kvm-host.toml):
//!
//! - pending: HS interrupts (the S file's SEI, SGEI = `hgeip & hgeie`,
//!   KVM's hrtimer as STI) exit whatever the guest does; then the VS
//!   interrupt `hip & hideleg & vsie` picks (external from the file VGEIN
//!   selects or `hvip.VSEIP`, software, timer), claimed through
//!   `vstopei` (a virtual instruction with the software file) or the
//!   PLIC's claim register (an MMIO exit);
//! - operations: no EOI with the IMSIC (the claim completed it), the
//!   PLIC's completion store; `stimecmp` with Sstc, the SBI timer without;
//!   an IPI as a store to the target's IMSIC page (G-stage mapped onto its
//!   file, or a store guest-page fault) or the SBI IPI call with a PLIC;
//!   WFI, trapping with `hstatus.VTW`;
//! - the exit path: the world switch, the scheme's handler, the host's
//!   interrupts, the software file's flush, the entry; a WFI exit with
//!   nothing pending blocks the vCPU thread (its file's `hgeie` bit set)
//!   until a kick wakes it.
//!
//! Guest interrupt identities: a guest handler `vector` is the identity
//! `vector` of its file (Linux's IMSIC driver gives each MSI an identity;
//! its IPI mux shares one, which changes no exit), and the PLIC source of
//! the same number; the timer is VSTI and an SBI IPI is VSSI with the
//! guest's IPI mux in memory.

use crate::engine::{Summary, Time, SEC};
use crate::guest::KernelOp;
use crate::hv::exits::EventClass;
use crate::hv::riscv::kvm_riscv_sw::plic_claim_complete;
use crate::hv::riscv::{
    ids, ExitAction, GuestIrqchip, RiscvCosts, RiscvCx, RiscvExit, RiscvExitReason, RiscvScheme,
    RiscvVcpu, SbiCall, VirtInsn,
};
use crate::hw::riscv::gstage::GStage;
use crate::hw::riscv::hart::{irq, VsCsr, VsOutcome};
use crate::hw::riscv::iommu::MsiTranslation;
use crate::hw::riscv::machine::{Landed, RiscvMachine};
use crate::hw::x86::core::CoreMode;
use crate::report::trace::TraceKind;
use crate::world::arch::{ArchExit, OpResult};
use crate::world::event::Ev;
use crate::world::World;

const REASONS: usize = RiscvExitReason::ALL.len();

/// One exit in progress on a hart.
#[derive(Clone, Copy, Debug)]
struct HsExit {
    vcpu: usize,
    exit: Option<RiscvExit>,
    start: Time,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The handler's work (and the world switch).
    Handler,
    /// Host interrupts taken between steps (or a vCPU being loaded).
    HostIrq,
    /// The flush before entry.
    Entering,
}

/// The RISC-V platform of a world: the hardware, the scheme, KVM RISC-V's
/// per-vCPU state and what the timed path keeps beside them.
pub(in crate::world) struct HsWorld {
    pub(in crate::world) m: RiscvMachine,
    pub(in crate::world) scheme: Box<dyn RiscvScheme>,
    pub(in crate::world) vcpus: Vec<RiscvVcpu>,
    costs: RiscvCosts,
    kicks: u64,
    /// The `time` CSR's frequency.
    timebase_hz: u64,
    /// The guest's timer handler.
    timer_vector: u8,
    /// The guest's VF handlers: `[first, first + queues)`.
    vf_vectors: (u8, u8),
    exits: Vec<Option<HsExit>>,
    /// Per hart: the `vstimecmp` an `HsVsTimer` is scheduled for, its
    /// generation.
    vs_timer: Vec<(u64, u64)>,
    /// Per vCPU: KVM's hrtimer deadline scheduled, its generation.
    kvm_timer: Vec<(Option<u64>, u64)>,
    /// Per hart: a KVM hrtimer fired there (the host's STI pending).
    sti: Vec<bool>,
    /// Per vCPU: the guest's IPI mux (SBI IPIs), by vector.
    ipi_mux: Vec<[u64; 4]>,
    /// Per vCPU: PLIC sources claimed and not completed, by vector.
    plic_active: Vec<[u64; 4]>,
    /// Per vCPU: the identity an emulated claim returned, delivered to the
    /// guest's handler at entry (0: none).
    claimed: Vec<u8>,
    /// Per vCPU: a wake-up is on its way.
    waking: Vec<bool>,
    /// Per VF: its MSI-X vectors the host's S file has signalled and the
    /// irqfd has not yet injected (with no IOMMU translation).
    host_vf_pending: Vec<u8>,
    /// Per vCPU: why it was last kicked (for the exits-per-event table).
    kick_class: Vec<EventClass>,
    /// Per hart: why the host's IPI pending there was sent.
    sei_class: Vec<EventClass>,
    measuring: bool,
    /// Per VM: exits by reason while measuring.
    stats: Vec<[u64; REASONS]>,
    /// Per vCPU: each reason's service times.
    exit_table: Vec<Vec<Summary>>,
}

/// Bit `v` of a 256-bit set.
fn set_bit(b: &mut [u64; 4], v: u8, on: bool) {
    let (w, m) = (usize::from(v) / 64, 1u64 << (v % 64));
    if on {
        b[w] |= m;
    } else {
        b[w] &= !m;
    }
}

fn has_bit(b: &[u64; 4], v: u8) -> bool {
    b[usize::from(v) / 64] >> (v % 64) & 1 != 0
}

/// The lowest set bit of a 256-bit set.
fn lowest(b: &[u64; 4]) -> Option<u8> {
    b.iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| (i * 64 + w.trailing_zeros() as usize) as u8)
}

impl HsWorld {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::world) fn new(
        m: RiscvMachine,
        scheme: Box<dyn RiscvScheme>,
        vcpus: Vec<RiscvVcpu>,
        costs: RiscvCosts,
        timebase_hz: u64,
        timer_vector: u8,
        vf_vectors: (u8, u8),
        vms: usize,
        vfs: usize,
    ) -> Self {
        let harts = m.harts.len();
        let n = vcpus.len();
        HsWorld {
            m,
            scheme,
            vcpus,
            costs,
            kicks: 0,
            timebase_hz: timebase_hz.max(1),
            timer_vector,
            vf_vectors,
            exits: vec![None; harts],
            vs_timer: vec![(u64::MAX, 0); harts],
            kvm_timer: vec![(None, 0); n],
            sti: vec![false; harts],
            ipi_mux: vec![[0; 4]; n],
            plic_active: vec![[0; 4]; n],
            claimed: vec![0; n],
            waking: vec![false; n],
            host_vf_pending: vec![0; vfs],
            kick_class: vec![EventClass::Other; n],
            sei_class: vec![EventClass::Other; harts],
            measuring: false,
            stats: vec![[0; REASONS]; vms],
            exit_table: vec![vec![Summary::default(); REASONS]; n],
        }
    }

    /// `time` at `t`.
    fn ticks(&self, t: Time) -> u64 {
        (u128::from(t) * u128::from(self.timebase_hz) / u128::from(SEC)) as u64
    }

    /// The first instant `time` reads `ticks`.
    fn time_of(&self, ticks: u64) -> Time {
        let hz = u128::from(self.timebase_hz);
        let t = (u128::from(ticks) * u128::from(SEC)).div_ceil(hz);
        Time::try_from(t).unwrap_or(Time::MAX)
    }

    /// The measured interval starts.
    pub(in crate::world) fn reset_stats(&mut self) {
        self.measuring = true;
        self.stats.iter_mut().for_each(|s| *s = [0; REASONS]);
        for t in &mut self.exit_table {
            t.iter_mut().for_each(|s| *s = Summary::default());
        }
    }

    /// `riscv.exits_per_s` and `riscv.exits.<REASON>` per VM.
    pub(in crate::world) fn metrics(&self, out: &mut crate::guest::app::Metrics, dur: f64) {
        for (vm, s) in self.stats.iter().enumerate() {
            let p = crate::report::vm_prefix(vm);
            let total: u64 = s.iter().sum();
            out.insert(
                format!("{p}riscv.exits_per_s"),
                total as f64 / dur.max(1e-12),
            );
            for r in RiscvExitReason::ALL {
                let n = s[r as usize];
                if n > 0 {
                    out.insert(format!("{p}riscv.exits.{}", r.name()), n as f64);
                }
            }
        }
    }
}

impl World {
    fn hs(&mut self) -> &mut HsWorld {
        self.hs.as_deref_mut().expect("a RISC-V world")
    }

    fn hs_cx(&mut self) -> (RiscvCx<'_>, &mut Box<dyn RiscvScheme>) {
        let now = self.q.now();
        let h = self.hs.as_deref_mut().expect("a RISC-V world");
        let ticks = h.ticks(now);
        (
            RiscvCx {
                now: ticks,
                m: &mut h.m,
                vcpus: &mut h.vcpus,
                costs: &h.costs,
                kicks: &mut h.kicks,
                charged: 0,
            },
            &mut h.scheme,
        )
    }

    /// The guest event an identity of VM `vm`'s files is.
    fn hs_id_class(&self, id: u32) -> EventClass {
        let h = self.hs.as_deref().expect("a RISC-V world");
        let (a, b) = h.vf_vectors;
        if (u32::from(a)..u32::from(b)).contains(&id) {
            EventClass::Device
        } else {
            EventClass::VcpuIpi
        }
    }

    /// What the guest on `core` does about pending interrupts.
    pub(in crate::world) fn hs_pending(&mut self, core: usize) -> Option<Result<ArchExit, u8>> {
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return None;
        };
        let (k, c) = self.kcpu(vcpu);
        let if_on = self.guests[k].interrupts_enabled(c);
        let now = self.q.now();
        let h = self.hs.as_deref_mut().expect("a RISC-V world");
        let t = h.ticks(now);
        let hgeip = h.m.hgeip(core);
        // HS-level interrupts are enabled whenever V = 1 (Privileged ISA
        // §3.1.6.1): each traps whatever the guest's SIE.
        let host = if h.m.imsics[core].seip() {
            Some(irq::SEI)
        } else if h.m.harts[core].sgei(hgeip) != 0 {
            Some(irq::SGEI)
        } else if h.sti[core] {
            Some(irq::STI)
        } else {
            None
        };
        if let Some(i) = host {
            return Some(Ok(ArchExit::Hs(RiscvExit::Interrupt { irq: i })));
        }
        match h.m.harts[core].vs_interrupt(hgeip, t, if_on)? {
            irq::VSEI => match h.scheme.guest_irqchip() {
                GuestIrqchip::Imsic => match h.m.harts[core].vs_csr(VsCsr::Stopei) {
                    VsOutcome::Executes => {
                        let g = h.m.harts[core].vgein();
                        let id = h.m.imsics[core].guest_mut(g).map_or(0, |f| f.claim());
                        (id != 0).then_some(Err(id as u8))
                    }
                    VsOutcome::VirtualInstruction => Some(Ok(ArchExit::Hs(
                        RiscvExit::VirtualInsn(VirtInsn::StopeiClaim),
                    ))),
                },
                GuestIrqchip::Plic => {
                    let gpa = plic_claim_complete(h.vcpus[vcpu].index);
                    Some(Ok(ArchExit::Hs(RiscvExit::GuestPageFault {
                        store: false,
                        gpa,
                        data: 0,
                    })))
                }
            },
            irq::VSSI => {
                // Linux's IPI mux: `csrc sip, SSIP` (in VS mode an alias of
                // hvip.VSSIP), then each IPI set in memory.
                let v = lowest(&h.ipi_mux[vcpu]);
                if let Some(v) = v {
                    set_bit(&mut h.ipi_mux[vcpu], v, false);
                }
                if lowest(&h.ipi_mux[vcpu]).is_none() {
                    h.m.harts[core].set_hvip(irq::VSSI, false);
                }
                v.map(Err)
            }
            _ => {
                // riscv_timer_interrupt masks its interrupt (`csr_clear
                // sie, STIE`: `vsie` in VS mode).
                h.m.harts[core].vsie &= !(1 << irq::VSTI);
                Some(Err(h.timer_vector))
            }
        }
    }

    /// The guest kernel's operation `op` on `core`, as the RISC-V
    /// instruction it is.
    pub(in crate::world) fn hs_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        let now = self.q.now();
        let vm = self.hv.vcpus[vcpu].vm;
        let hs = |e| OpResult::Exit(ArchExit::Hs(e), None);
        match op {
            KernelOp::EndOfInterrupt { vector } => {
                self.trace_event(TraceKind::Eoi { vector }, core, vcpu, now, now);
                self.checker.eoi(vcpu, vector, Some(vector), now);
                let h = self.hs();
                if has_bit(&h.plic_active[vcpu], vector) {
                    // The PLIC's completion: a store to its claim/complete
                    // register, which the VMM emulates.
                    set_bit(&mut h.plic_active[vcpu], vector, false);
                    let gpa = plic_claim_complete(h.vcpus[vcpu].index);
                    return hs(RiscvExit::GuestPageFault {
                        store: true,
                        gpa,
                        data: u32::from(vector),
                    });
                }
                // The IMSIC has no EOI: the claim completed it.
                OpResult::Continue
            }
            KernelOp::ProgramClockevent {
                ticks,
                deadline,
                vector,
            } => {
                self.checker.timer_programmed(vcpu, vector, deadline, now);
                let h = self.hs();
                let at = match deadline {
                    Some(_) => h.ticks(now) + u64::from(ticks),
                    // riscv_clock_shutdown: the compare at its maximum.
                    None => u64::MAX,
                };
                // riscv_clock_next_event unmasks the timer (`csr_set sie,
                // STIE`), then writes the compare.
                h.m.harts[core].vsie |= 1 << irq::VSTI;
                if !h.scheme.sstc() {
                    return hs(RiscvExit::Sbi(SbiCall::SetTimer { stime: at }));
                }
                match h.m.harts[core].vs_csr(VsCsr::Stimecmp) {
                    VsOutcome::Executes => {
                        h.m.harts[core].vstimecmp = at;
                        self.hs_sync_timers();
                        OpResult::Continue
                    }
                    VsOutcome::VirtualInstruction => {
                        hs(RiscvExit::VirtualInsn(VirtInsn::Stimecmp { value: at }))
                    }
                }
            }
            KernelOp::ClockeventInit { .. } => OpResult::Continue,
            KernelOp::SendIpi { cpu, vector } => {
                let Some(&t) = self.hv.vms[vm].vcpus.get(cpu as usize) else {
                    return OpResult::Continue;
                };
                self.checker.raised_on(t, vector, now);
                self.hs().kick_class[t] = EventClass::VcpuIpi;
                let h = self.hs();
                match h.scheme.guest_irqchip() {
                    GuestIrqchip::Imsic => {
                        // A store of the identity to the target's IMSIC page.
                        let gpa = GStage::guest_page(h.vcpus[t].index);
                        let r = {
                            let (mut cx, _) = self.hs_cx();
                            cx.guest_store(vm, gpa, u32::from(vector))
                        };
                        match r {
                            Ok(Landed::File { hart, .. }) => {
                                let lat = self.hs().costs.msi_latency;
                                self.q
                                    .schedule_in_async(lat, Ev::HsPoke { core: hart as u16 });
                                OpResult::Continue
                            }
                            Ok(Landed::Elsewhere) => OpResult::Continue,
                            Err(e) => hs(e),
                        }
                    }
                    GuestIrqchip::Plic => {
                        set_bit(&mut h.ipi_mux[t], vector, true);
                        let mask = 1u64 << h.vcpus[t].index;
                        hs(RiscvExit::Sbi(SbiCall::SendIpi { mask }))
                    }
                }
            }
            KernelOp::Idle => {
                if self.hs().m.harts[core].wfi() == VsOutcome::VirtualInstruction {
                    hs(RiscvExit::VirtualInsn(VirtInsn::Wfi))
                } else {
                    // WFI in VS mode: the hart waits for any interrupt
                    // pending and enabled for it (a poke).
                    OpResult::Wait
                }
            }
            KernelOp::VfWrite { vf, reg } => {
                self.vf_store(vf, reg, now);
                OpResult::Continue
            }
            // Refused at build on RISC-V (virtio; the x86 DID module and
            // micro-benchmarks).
            KernelOp::QueueNotify { .. }
            | KernelOp::Hypercall { .. }
            | KernelOp::PirSet { .. }
            | KernelOp::PostedIpi { .. }
            | KernelOp::SelfIpi { .. }
            | KernelOp::TaskPriority { .. } => OpResult::Continue,
        }
    }

    /// The guest event an exit on `core` is charged to.
    fn hs_exit_class(&self, core: usize, vcpu: usize, exit: RiscvExit) -> EventClass {
        let h = self.hs.as_deref().expect("a RISC-V world");
        match exit {
            RiscvExit::Interrupt { irq: i } if i == irq::SEI => {
                let top = h.m.imsics[core].s_file.topei();
                if top == ids::HOST_IPI {
                    h.sei_class[core]
                } else if top >= ids::HOST_VF_BASE {
                    EventClass::Device
                } else {
                    EventClass::Other
                }
            }
            RiscvExit::Interrupt { irq: i } if i == irq::SGEI => {
                let m = h.m.harts[core].sgei(h.m.hgeip(core));
                let g = m.trailing_zeros() as usize;
                let id = h.m.imsics[core].guest(g).map_or(0, |f| f.topei());
                self.hs_id_class(id)
            }
            RiscvExit::Interrupt { .. } => EventClass::TimerExpiry,
            RiscvExit::VirtualInsn(VirtInsn::Wfi) => EventClass::Idle,
            RiscvExit::VirtualInsn(VirtInsn::StopeiClaim) => {
                self.hs_id_class(h.vcpus[vcpu].swfile.topei())
            }
            RiscvExit::VirtualInsn(VirtInsn::Stimecmp { .. })
            | RiscvExit::Sbi(SbiCall::SetTimer { .. }) => EventClass::TimerProgram,
            RiscvExit::Sbi(SbiCall::SendIpi { .. }) => EventClass::VcpuIpi,
            RiscvExit::GuestPageFault { store, gpa, .. } => {
                if gpa == plic_claim_complete(h.vcpus[vcpu].index) {
                    if store {
                        EventClass::Eoi
                    } else {
                        self.hs_id_class(h.vcpus[vcpu].swfile.topei())
                    }
                } else {
                    EventClass::VcpuIpi
                }
            }
        }
    }

    /// The guest on `core` traps to HS mode with `exit`.
    pub(in crate::world) fn hs_exit(&mut self, core: usize, exit: RiscvExit) {
        let now = self.q.now();
        self.pause_guest(core);
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return;
        };
        self.account_guest_time(core, vcpu, now);
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        let class = self.hs_exit_class(core, vcpu, exit);
        let vm = self.hv.vcpus[vcpu].vm;
        if let Some(e) = &mut self.event_exits {
            e.exit(vm, class);
        }
        let h = self.hs();
        if h.measuring {
            h.stats[vm][exit.reason() as usize] += 1;
        }
        // The trap and the sret back.
        let base = 2 * h.costs.world_switch;
        let (action, charged) = {
            let (mut cx, scheme) = self.hs_cx();
            let a = scheme.handle_exit(&mut cx, vcpu, exit);
            (a, cx.charged)
        };
        let h = self.hs();
        // An emulated claim: the identity the guest's handler runs for.
        let id = std::mem::take(&mut h.vcpus[vcpu].claimed);
        if id != 0 {
            h.claimed[vcpu] = id as u8;
            if matches!(exit, RiscvExit::GuestPageFault { store: false, .. }) {
                set_bit(&mut h.plic_active[vcpu], id as u8, true);
            }
        }
        if action == ExitAction::Halt {
            self.hv.vcpus[vcpu].halted = true;
        }
        self.hs().exits[core] = Some(HsExit {
            vcpu,
            exit: Some(exit),
            start: now,
            stage: Stage::Handler,
        });
        self.hs_sync_timers();
        self.hs_kicks();
        self.start_segment(core, (base + charged).max(1));
    }

    /// The host takes the HS interrupts pending at `core` (its S file's,
    /// the SGEI, KVM's hrtimers); returns the work charged.
    fn hs_host_irqs(&mut self, core: usize) -> Time {
        let mut charged = 0;
        for _ in 0..64 {
            let h = self.hs();
            let id = h.m.imsics[core].s_file.claim();
            if id == 0 {
                break;
            }
            let vf = id.checked_sub(ids::HOST_VF_BASE).map(|v| v as usize);
            let pending = match vf {
                Some(vf) => h.host_vf_pending.get_mut(vf).map_or(0, std::mem::take),
                None => 0,
            };
            // The VF's host IRQ: KVM's irqfd injects each of its vectors
            // into the owner's file.
            let targets = vf.and_then(|vf| self.vf_owner.get(vf).copied());
            let dest = targets.map(|(vm, _)| self.hv.msi_destination(vm));
            let (mut cx, scheme) = self.hs_cx();
            scheme.host_irq(&mut cx, core, irq::SEI);
            if let (Some((_, base)), Some(d)) = (targets, dest) {
                let mut bits = pending;
                while bits != 0 {
                    let q = bits.trailing_zeros() as u8;
                    bits &= bits - 1;
                    scheme.device_msi(&mut cx, d, u32::from(base.wrapping_add(q)));
                }
            }
            charged += cx.charged.max(1);
        }
        let h = self.hs();
        if h.m.harts[core].sgei(h.m.hgeip(core)) != 0 {
            let (mut cx, scheme) = self.hs_cx();
            scheme.host_irq(&mut cx, core, irq::SGEI);
            charged += cx.charged.max(1);
        }
        if std::mem::take(&mut self.hs().sti[core]) {
            let now = self.q.now();
            let t = self.hs().ticks(now);
            let here: u64 = (0..self.hv.vcpus.len())
                .filter(|&v| self.hv.vcpus[v].core == core)
                .fold(0, |m, v| m | 1 << v);
            let (mut cx, scheme) = self.hs_cx();
            scheme.host_irq(&mut cx, core, irq::STI);
            let mut bits = here;
            while bits != 0 {
                let v = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if cx.vcpus[v].timer.is_some_and(|d| d <= t) {
                    scheme.timer_fired(&mut cx, v);
                }
            }
            charged += cx.charged.max(1);
        }
        self.hs_sync_timers();
        self.hs_kicks();
        charged
    }

    /// A host-mode step on `core` ended.
    pub(in crate::world) fn hs_stage_done(&mut self, core: usize) {
        let Some(mut e) = self.hs().exits[core] else {
            return;
        };
        if e.stage == Stage::Entering {
            return self.hs_entry(core);
        }
        let charged = self.hs_host_irqs(core);
        if charged > 0 {
            e.stage = Stage::HostIrq;
            self.hs().exits[core] = Some(e);
            return self.start_segment(core, charged);
        }
        let vcpu = e.vcpu;
        if self.hv.vcpus[vcpu].halted {
            let runnable = {
                let (cx, scheme) = self.hs_cx();
                scheme.has_pending(&cx, vcpu)
            };
            if !runnable {
                return self.hs_block(core, vcpu);
            }
            self.hv.vcpus[vcpu].halted = false;
        }
        let charged = {
            let (mut cx, scheme) = self.hs_cx();
            scheme.flush(&mut cx, vcpu);
            cx.charged
        };
        self.hs_kicks();
        e.stage = Stage::Entering;
        self.hs().exits[core] = Some(e);
        if charged > 0 {
            self.start_segment(core, charged);
        } else {
            self.hs_entry(core);
        }
    }

    /// An exit of `e.vcpu` ends now: its service time recorded.
    fn hs_exit_done(&mut self, core: usize, e: HsExit) {
        let now = self.q.now();
        let ms = self.measure_start;
        let h = self.hs();
        if let Some(x) = e.exit {
            if h.measuring && e.start >= ms {
                h.exit_table[e.vcpu][x.reason() as usize].record(now - e.start);
            }
        }
        let kind = e.exit.map_or(TraceKind::ScheduleIn, TraceKind::HsExit);
        self.trace_event(kind, core, e.vcpu, e.start, now);
    }

    /// The entry (sret to VS mode).
    fn hs_entry(&mut self, core: usize) {
        let now = self.q.now();
        let Some(e) = self.hs().exits[core].take() else {
            return;
        };
        let vcpu = e.vcpu;
        self.hs_exit_done(core, e);
        if std::mem::take(&mut self.deschedule_pending[vcpu]) {
            return self.hs_put(core, vcpu);
        }
        self.m.cores[core].mode = CoreMode::Guest { vcpu };
        self.m.cores[core].guest_since = now;
        self.hs_sync_timers();
        let id = std::mem::take(&mut self.hs().claimed[vcpu]);
        if id != 0 {
            self.deliver(core, id);
        }
        self.guest_run(core);
    }

    /// The WFI exit found nothing pending: the vCPU thread blocks
    /// (kvm_vcpu_halt; its file's SGEI armed, its timer an hrtimer).
    fn hs_block(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        self.deschedule_pending[vcpu] = false;
        if let Some(e) = self.hs().exits[core].take() {
            self.hs_exit_done(core, e);
        }
        {
            let (mut cx, scheme) = self.hs_cx();
            scheme.vcpu_put(&mut cx, vcpu, true);
        }
        self.m.cores[core].mode = CoreMode::Idle;
        self.checker.set_running(vcpu, false, now);
        self.checker.set_blocked(vcpu, true, now);
        self.hs_sync_timers();
        self.hs_host_irqs(core);
        if self.sched.is_some() {
            self.sched_after_put(core);
            self.sched_vcpu_blocked(core, vcpu);
            self.trace_sched(core);
        }
    }

    /// kvm_arch_vcpu_put of a preempted (runnable) `vcpu` on `core`.
    pub(in crate::world) fn hs_put(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        self.m.cores[core].mode = CoreMode::Idle;
        self.hv.sched_out(vcpu);
        {
            let (mut cx, scheme) = self.hs_cx();
            scheme.vcpu_put(&mut cx, vcpu, false);
        }
        self.checker.set_running(vcpu, false, now);
        self.hs_sync_timers();
        self.hs_host_irqs(core);
        self.sched_after_put(core);
        let elsewhere = self.sched.as_ref().is_some_and(|st| {
            let c = st.s.thread(vcpu).core;
            c != core && st.s.current(c) == Some(vcpu)
        });
        if elsewhere {
            self.hs_reschedule(vcpu);
        }
    }

    /// Schedule-in of runnable `vcpu` where the host scheduler runs its
    /// thread: kvm_arch_vcpu_load there (its file follows it), then entry.
    pub(in crate::world) fn hs_reschedule(&mut self, vcpu: usize) {
        let Some(core) = self.schedule_in_core(vcpu) else {
            return;
        };
        let now = self.q.now();
        let charged = self.load_vcpu_on(core, vcpu, now, |w| {
            let (mut cx, scheme) = w.hs_cx();
            scheme.vcpu_load(&mut cx, vcpu, core);
            cx.charged
        });
        self.hs_enter_after_load(core, vcpu, now, charged);
    }

    /// The entry path after `vcpu` was loaded on `core` at cost `charged`.
    fn hs_enter_after_load(&mut self, core: usize, vcpu: usize, now: Time, charged: Time) {
        let h = self.hs();
        let entry = h.costs.world_switch;
        h.exits[core] = Some(HsExit {
            vcpu,
            exit: None,
            start: now,
            stage: Stage::HostIrq,
        });
        self.hs_sync_timers();
        self.hs_kicks();
        self.start_segment(core, (charged + entry).max(1));
    }

    /// A blocked vCPU's thread runs again (no host scheduler): load, then
    /// the entry path (which checks it has something to do).
    fn hs_wake(&mut self, vcpu: usize) {
        let now = self.q.now();
        self.hs().waking[vcpu] = false;
        let core = self.hv.vcpus[vcpu].core;
        if self.m.cores[core].mode != CoreMode::Idle || !self.hv.vcpus[vcpu].halted {
            return;
        }
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.checker.set_blocked(vcpu, false, now);
        self.checker.set_running(vcpu, true, now);
        let charged = {
            let (mut cx, scheme) = self.hs_cx();
            scheme.vcpu_load(&mut cx, vcpu, core);
            cx.charged
        };
        self.hs_enter_after_load(core, vcpu, now, charged);
    }

    /// The kicks the scheme asked for (kvm_vcpu_kick): a vCPU in VS mode
    /// gets the host's IPI on its hart, a blocked one is woken.
    fn hs_kicks(&mut self) {
        self.drain_kicks(|w| std::mem::take(&mut w.hs().kicks), World::hs_kick);
    }

    fn hs_kick(&mut self, vcpu: usize) {
        let core = self.hv.vcpus[vcpu].core;
        let halted = self.hv.vcpus[vcpu].halted;
        let sched = self.sched.is_some();
        let loaded = self.hv.vcpus[vcpu].loaded;
        let h = self.hs.as_deref_mut().expect("a RISC-V world");
        let why = h.kick_class[vcpu];
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu: v } if v == vcpu => {
                h.sei_class[core] = why;
                self.q
                    .schedule_in_async(h.costs.msi_latency, Ev::HsHostIpi { core: core as u16 });
            }
            CoreMode::Idle if !sched && halted && !h.waking[vcpu] => {
                h.waking[vcpu] = true;
                self.q
                    .schedule_in(h.costs.vcpu_wakeup, Ev::HsWake { vcpu: vcpu as u16 });
            }
            _ if sched && halted && !loaded => {
                let lat = h.costs.vcpu_wakeup;
                self.hv.vcpus[vcpu].halted = false;
                self.checker.set_blocked(vcpu, false, self.q.now());
                self.sched_wake_thread(vcpu, lat);
            }
            _ => {}
        }
    }

    /// KVM's hrtimers and the harts' `vstimecmp` against the events
    /// scheduled for them: a changed deadline gets a new event (the old
    /// one goes stale).
    fn hs_sync_timers(&mut self) {
        let h = self.hs.as_deref_mut().expect("a RISC-V world");
        for hart in 0..h.m.harts.len() {
            let cmp = h.m.harts[hart].vstimecmp;
            if cmp != h.vs_timer[hart].0 {
                let gen = h.vs_timer[hart].1 + 1;
                h.vs_timer[hart] = (cmp, gen);
                if cmp != u64::MAX {
                    let at = h.time_of(cmp).max(self.q.now());
                    self.q.schedule(
                        at,
                        Ev::HsVsTimer {
                            core: hart as u16,
                            gen,
                        },
                    );
                }
            }
        }
        for v in 0..h.vcpus.len() {
            let t = h.vcpus[v].timer;
            if t != h.kvm_timer[v].0 {
                let gen = h.kvm_timer[v].1 + 1;
                h.kvm_timer[v] = (t, gen);
                if let Some(d) = t {
                    let at = h.time_of(d).max(self.q.now());
                    self.q.schedule(
                        at,
                        Ev::HsKvmTimer {
                            vcpu: v as u16,
                            gen,
                        },
                    );
                }
            }
        }
    }

    /// Something changed at `core`'s interrupt files or timers: a guest
    /// looks again; an idle hart's host takes its interrupts now; a hart in
    /// HS mode takes them between its steps.
    fn hs_poke(&mut self, core: usize) {
        match self.m.cores[core].mode {
            CoreMode::Guest { .. } | CoreMode::Native { .. } => {
                self.pause_guest(core);
                self.guest_run(core);
            }
            CoreMode::Host { .. } => {}
            CoreMode::Idle => {
                self.hs_host_irqs(core);
            }
        }
    }

    /// The RISC-V events.
    pub(in crate::world) fn hs_event(&mut self, ev: Ev, _now: Time) {
        match ev {
            Ev::HsVsTimer { core, gen } => {
                let core = core as usize;
                if self.hs().vs_timer[core].1 == gen {
                    self.hs_poke(core);
                }
            }
            Ev::HsKvmTimer { vcpu, gen } => {
                let vcpu = vcpu as usize;
                if self.hs().kvm_timer[vcpu].1 == gen {
                    let core = self.hv.vcpus[vcpu].core;
                    self.hs().kick_class[vcpu] = EventClass::TimerExpiry;
                    self.hs().sti[core] = true;
                    self.hs_poke(core);
                }
            }
            Ev::HsHostIpi { core } => {
                let core = core as usize;
                let h = self.hs();
                let a = h.m.params.file_address(core, 0);
                h.m.store(a, ids::HOST_IPI);
                self.hs_poke(core);
            }
            Ev::HsMsi { vf, vector } => self.hs_msi_arrives(vf, vector),
            Ev::HsPoke { core } => self.hs_poke(core as usize),
            Ev::HsWake { vcpu } => self.hs_wake(vcpu as usize),
            _ => {}
        }
    }

    /// VF `vf` fired its MSI-X `vector`: the write reaches the IOMMU after
    /// the fabric's latency.
    pub(in crate::world) fn hs_device_msi(&mut self, vf: u16, vector: u8) {
        let lat = self.hs().costs.msi_latency;
        self.q.schedule_in_async(lat, Ev::HsMsi { vf, vector });
    }

    /// The VF's MSI at the IOMMU: its guest-physical address is the target
    /// vCPU's IMSIC page, its data the identity. A device context with MSI
    /// translation on rewrites it into the guest file the PTE names
    /// (flat mode); with none, the MSI is the host's, to its S file on the
    /// target vCPU's hart, and KVM's irqfd injects it.
    fn hs_msi_arrives(&mut self, vf: u16, vector: u8) {
        let Some(&(vm, base)) = self.vf_owner.get(usize::from(vf)) else {
            return;
        };
        let target = self.hv.msi_destination(vm);
        let hart = self.hv.vcpus[target].core;
        let h = self.hs();
        let gpa = GStage::guest_page(h.vcpus[target].index);
        let id = u32::from(base.wrapping_add(vector));
        let (t, landed) = h.m.device_msi(usize::from(vf), gpa, id);
        match t {
            MsiTranslation::Untranslated => {
                if let Some(p) = h.host_vf_pending.get_mut(usize::from(vf)) {
                    *p |= 1 << vector;
                }
                let a = h.m.params.file_address(hart, 0);
                h.m.store(a, ids::HOST_VF_BASE + u32::from(vf));
                self.hs_poke(hart);
            }
            MsiTranslation::Fault => self.msi_faults += 1,
            _ => {
                if let Landed::File { hart, .. } = landed {
                    self.hs_poke(hart);
                }
            }
        }
    }

    /// The host's reschedule IPI to `core` (`host.ipi_per_s`): its S file's
    /// SEI, an exit if a guest runs there.
    pub(in crate::world) fn hs_host_ipi(&mut self, core: usize) {
        self.hs().sei_class[core] = EventClass::HostIpi;
        let h = self.hs();
        let a = h.m.params.file_address(core, 0);
        h.m.store(a, ids::HOST_IPI);
        self.hs_poke(core);
    }

    /// Each VM's exits by the RISC-V reasons (`scause` classes).
    pub(in crate::world) fn hs_exit_tables(&self) -> crate::report::ExitTables {
        let h = self.hs.as_deref().expect("a RISC-V world");
        let vms = &self.hv.vms;
        crate::report::ExitTables {
            names: RiscvExitReason::ALL.iter().map(|r| r.name()).collect(),
            vms: vms
                .iter()
                .map(|vm| {
                    let mut t = vec![Summary::default(); REASONS];
                    for &v in &vm.vcpus {
                        for (r, s) in h.exit_table[v].iter().enumerate() {
                            t[r].merge(s);
                        }
                    }
                    t
                })
                .collect(),
            vcpus: vms
                .iter()
                .map(|vm| vm.vcpus.iter().map(|&v| h.exit_table[v].clone()).collect())
                .collect(),
        }
    }

    /// At the end of the run: a vCPU left blocked with an interrupt
    /// pending (its file signalling, its SGEI or kick lost) was never woken.
    pub(in crate::world) fn hs_finish(&mut self) {
        let now = self.q.now();
        for v in 0..self.hv.vcpus.len() {
            let blocked = self.hv.vcpus[v].halted && !self.hv.vcpus[v].loaded;
            if !blocked || self.hs().waking[v] {
                continue;
            }
            let pending = {
                let (cx, scheme) = self.hs_cx();
                scheme.has_pending(&cx, v)
            };
            if pending {
                self.checker.gic_violation(
                    v,
                    0,
                    now,
                    format!("vCPU {v} left blocked in WFI with an interrupt pending (no SGEI or kick woke it)"),
                );
            }
        }
    }
}
