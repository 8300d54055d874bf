//! RISC-V with the H extension on the platform: the sibling of
//! `world::vmx` and `world::el2`. This part is the execution at the
//! instruction level: each guest event lowered to the RISC-V instructions
//! Linux's guest runs for it, each asking the hardware (`hw::riscv`)
//! whether it traps to HS mode, and each trap handed to the scheme
//! (`hv::riscv::RiscvScheme`) as `kvm_riscv_vcpu_exit` would see it:
//!
//! | guest event        | instruction(s)                                   | traps when |
//! |--------------------|--------------------------------------------------|------------|
//! | claim              | `csrrw vstopei` (IMSIC) / load of the PLIC's claim register | VGEIN names no guest file / always (MMIO) |
//! | end of interrupt   | none (IMSIC) / store to the PLIC's complete register | — / always |
//! | timer programming  | `csrw stimecmp` (Sstc) / SBI `set_timer`          | STCE clear / always (ecall) |
//! | timer expiry       | VSTIP from `vstimecmp` / KVM's hrtimer sets `hvip.VSTIP` | — / the host's timer interrupt |
//! | IPI                | store to the target's IMSIC page / SBI `send_ipi` | page unmapped (software file) / always |
//! | idle               | `wfi`                                            | `hstatus.VTW` |
//! | host interrupt     | S file SEI, SGEI, the host's timer               | always (HS interrupts are enabled in V = 1) |
//!
//! [`HsStepper`] runs one guest event at a time on a machine of harts and
//! vCPUs to quiescence (every interrupt raised taken by its handler) and
//! records the exits on the way: the exits-per-event table of
//! docs/riscv.md comes from it. It has no clock beyond the `time` CSR's
//! ticks and charges no cost. The timed event loop's RISC-V answers
//! (`Arch::RiscvHs` in `world::arch`) are in `timed`, with the same
//! lowering and the costs of calibration/riscv-kvm-host.toml.

use crate::hv::riscv::kvm_riscv_sw::plic_claim_complete;
use crate::hv::riscv::{
    by_name, ids, ExitAction, GuestIrqchip, RiscvConfig, RiscvCosts, RiscvCx, RiscvExit,
    RiscvScheme, RiscvVcpu, SbiCall, VirtInsn,
};
use crate::hw::riscv::gstage::GStage;
use crate::hw::riscv::hart::{irq, VsCsr, VsOutcome, VS_BITS};
use crate::hw::riscv::imsic::ISELECT_EIDELIVERY;
use crate::hw::riscv::iommu::MsiTranslation;
use crate::hw::riscv::machine::RiscvMachine;
use crate::hw::riscv::params::AiaParams;

/// A guest event, in the guest kernel's arch-neutral terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestEvent {
    /// `vcpu` programs its clockevent for `at` (`time` ticks).
    TimerProgram {
        /// The vCPU.
        vcpu: usize,
        /// The deadline.
        at: u64,
    },
    /// Time reaches `vcpu`'s timer deadline; its handler runs.
    TimerExpiry {
        /// The vCPU.
        vcpu: usize,
    },
    /// The VM's VF sends its MSI for `vcpu`; the handler claims and
    /// completes it.
    Device {
        /// The vCPU.
        vcpu: usize,
    },
    /// `from` sends an IPI to `to`; `to`'s handler runs.
    Ipi {
        /// Sender.
        from: usize,
        /// Target.
        to: usize,
    },
    /// `vcpu` idles (WFI) until its next interrupt.
    Idle {
        /// The vCPU.
        vcpu: usize,
    },
}

/// What a handler ran for: an identity of the vCPU's interrupt file (or
/// PLIC source), or a VS-level software or timer interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// External interrupt with this identity.
    External(u32),
    /// VS software interrupt (an SBI IPI).
    Software,
    /// VS timer interrupt.
    Timer,
}

/// A machine of harts running one VM's vCPUs under a RISC-V scheme.
pub struct HsStepper {
    /// The hardware.
    pub m: RiscvMachine,
    /// KVM's per-vCPU state.
    pub vcpus: Vec<RiscvVcpu>,
    scheme: Box<dyn RiscvScheme>,
    costs: RiscvCosts,
    kicks: u64,
    now: u64,
    /// Per hart: the vCPU in VS mode on it.
    running: Vec<Option<usize>>,
    /// Per vCPU: its hart.
    home: Vec<usize>,
    /// The vCPU the VF's MSI is for.
    vf_target: usize,
    /// The exits of the event in progress: (vCPU, exit).
    exits: Vec<(usize, RiscvExit)>,
    /// The handlers run in the event in progress.
    handled: Vec<(usize, Handled)>,
    /// MSIs the IOMMU refused.
    pub msi_faults: u64,
}

impl HsStepper {
    /// Scheme `scheme` with `cfg` on `harts` harts of `geilen` guest files,
    /// one VM whose vCPU `v` lives on hart `home[v]` with a VF (IOMMU
    /// device 0). Each vCPU is loaded on its hart in order (so a hart's
    /// last vCPU runs and the others wait preempted, holding whatever file
    /// their load got), then its guest boots: its file's delivery on,
    /// identities 1..=63 enabled, `sie` on.
    pub fn new(
        scheme: &str,
        cfg: RiscvConfig,
        harts: usize,
        geilen: usize,
        home: &[usize],
    ) -> Result<Self, String> {
        let scheme = by_name(scheme, cfg).ok_or_else(|| format!("unknown scheme {scheme}"))?;
        // did-riscv's vCPUs own their harts (docs/riscv.md, condition 1):
        // a second vCPU on one would not find VGEIN naming its file.
        if scheme.name() == "did-riscv" {
            for (v, h) in home.iter().enumerate() {
                if home[..v].contains(h) {
                    return Err(format!(
                        "scheme did-riscv: vCPUs {} and {v} share hart {h}; each vCPU needs a \
                         dedicated hart whose guest file stays its own (docs/riscv.md)",
                        home[..v].iter().position(|x| x == h).unwrap_or(0)
                    ));
                }
            }
        }
        let m = RiscvMachine::new(AiaParams::new(harts, geilen), 1, &[home.len()])?;
        let nids = m.params.ids;
        let mut s = HsStepper {
            m,
            vcpus: (0..home.len())
                .map(|i| RiscvVcpu::new(0, i, nids))
                .collect(),
            scheme,
            costs: RiscvCosts::default(),
            kicks: 0,
            now: 0,
            running: vec![None; harts],
            home: home.to_vec(),
            vf_target: 0,
            exits: Vec::with_capacity(16),
            handled: Vec::with_capacity(16),
            msi_faults: 0,
        };
        // The host's S files: Linux's IMSIC driver on every hart.
        for i in &mut s.m.imsics {
            i.s_file.write_ireg(ISELECT_EIDELIVERY, 1).ok();
            i.s_file.set_enabled(ids::HOST_IPI, true);
            i.s_file.set_enabled(ids::HOST_VF_BASE, true);
        }
        {
            let (mut cx, scheme) = s.cx();
            scheme.setup_vm(&mut cx, 0, Some(0));
        }
        for v in 0..home.len() {
            s.enter(v);
            let (mut cx, _) = s.cx();
            let f = cx.file(v);
            f.write_ireg(ISELECT_EIDELIVERY, 1).ok();
            for id in 1..=63 {
                f.set_enabled(id, true);
            }
            let h = s.home[v];
            s.m.harts[h].vsie = VS_BITS;
        }
        s.exits.clear();
        s.settle();
        s.exits.clear();
        s.handled.clear();
        Ok(s)
    }

    fn cx(&mut self) -> (RiscvCx<'_>, &mut Box<dyn RiscvScheme>) {
        (
            RiscvCx {
                now: self.now,
                m: &mut self.m,
                vcpus: &mut self.vcpus,
                costs: &self.costs,
                kicks: &mut self.kicks,
                charged: 0,
            },
            &mut self.scheme,
        )
    }

    /// The scheme's name.
    pub fn scheme(&self) -> &'static str {
        self.scheme.name()
    }

    /// Whether `vcpu` is in VS mode on its hart.
    pub fn is_running(&self, vcpu: usize) -> bool {
        self.running[self.home[vcpu]] == Some(vcpu)
    }

    /// Schedule-in of `vcpu` on its hart (the vCPU there, if another, is
    /// preempted), then the entry.
    pub fn enter(&mut self, vcpu: usize) {
        let h = self.home[vcpu];
        match self.running[h] {
            Some(v) if v == vcpu => return,
            Some(o) => self.put(o, false),
            None => {}
        }
        {
            let (mut cx, scheme) = self.cx();
            scheme.vcpu_load(&mut cx, vcpu, h);
        }
        self.vcpus[vcpu].blocked = false;
        self.running[h] = Some(vcpu);
        self.flush(vcpu);
    }

    fn put(&mut self, vcpu: usize, blocking: bool) {
        let h = self.home[vcpu];
        let (mut cx, scheme) = self.cx();
        scheme.vcpu_put(&mut cx, vcpu, blocking);
        self.running[h] = None;
    }

    fn flush(&mut self, vcpu: usize) {
        let (mut cx, scheme) = self.cx();
        scheme.flush(&mut cx, vcpu);
    }

    /// `vcpu` traps with `exit`; the scheme handles it; the vCPU enters
    /// again or blocks.
    fn exit(&mut self, vcpu: usize, exit: RiscvExit) {
        self.exits.push((vcpu, exit));
        let action = {
            let (mut cx, scheme) = self.cx();
            scheme.handle_exit(&mut cx, vcpu, exit)
        };
        self.kicks &= !(1 << vcpu);
        match action {
            ExitAction::Halt => {
                let pending = {
                    let (cx, scheme) = self.cx();
                    scheme.has_pending(&cx, vcpu)
                };
                if !pending {
                    self.put(vcpu, true);
                } else {
                    self.flush(vcpu);
                }
            }
            ExitAction::Resume => self.flush(vcpu),
        }
    }

    /// The host takes what is pending at hart `h`'s S file and its SGEI.
    /// Returns whether it took anything.
    fn host_irqs(&mut self, h: usize) -> bool {
        let mut took = false;
        loop {
            let id = self.m.imsics[h].s_file.claim();
            if id == 0 {
                break;
            }
            took = true;
            let t = self.vf_target;
            let (mut cx, scheme) = self.cx();
            scheme.host_irq(&mut cx, h, irq::SEI);
            if id == ids::HOST_VF_BASE {
                // KVM's irqfd for the VF's MSI.
                scheme.device_msi(&mut cx, t, ids::GUEST_VF);
            }
        }
        if self.m.harts[h].sgei(self.m.hgeip(h)) != 0 {
            took = true;
            let (mut cx, scheme) = self.cx();
            scheme.host_irq(&mut cx, h, irq::SGEI);
        }
        took
    }

    /// Runs everything raised to quiescence: host interrupts (exits where
    /// a guest runs), kicks (an IPI to a running vCPU's hart, a wake-up of
    /// a blocked one), and each running guest's interrupts.
    fn settle(&mut self) {
        for _ in 0..256 {
            let mut progressed = false;
            for h in 0..self.running.len() {
                match self.running[h] {
                    Some(v) => {
                        let sgei = self.m.harts[h].sgei(self.m.hgeip(h)) != 0;
                        let seip = self.m.imsics[h].seip();
                        if seip || sgei {
                            let irq = if seip { irq::SEI } else { irq::SGEI };
                            self.exits.push((v, RiscvExit::Interrupt { irq }));
                            self.host_irqs(h);
                            // A kick of the vCPU in this very exit needs no
                            // IPI: it is out of guest mode (KVM's vcpu->mode)
                            // and its entry looks again.
                            self.kicks &= !(1 << v);
                            self.flush(v);
                            progressed = true;
                        }
                    }
                    None => progressed |= self.host_irqs(h),
                }
            }
            let mut k = std::mem::take(&mut self.kicks);
            while k != 0 {
                let v = k.trailing_zeros() as usize;
                k &= k - 1;
                let h = self.home[v];
                if self.running[h] == Some(v) {
                    // kvm_vcpu_kick of a vCPU in VS mode: the host's IPI.
                    let a = self.m.params.file_address(h, 0);
                    self.m.store(a, ids::HOST_IPI);
                    progressed = true;
                } else if self.vcpus[v].blocked {
                    let pending = {
                        let (cx, scheme) = self.cx();
                        scheme.has_pending(&cx, v)
                    };
                    if pending {
                        self.enter(v);
                        progressed = true;
                    }
                }
            }
            for h in 0..self.running.len() {
                let Some(v) = self.running[h] else { continue };
                let hgeip = self.m.hgeip(h);
                if let Some(i) = self.m.harts[h].vs_interrupt(hgeip, self.now, true) {
                    self.take(v, i);
                    progressed = true;
                }
            }
            if !progressed {
                return;
            }
        }
    }

    /// `vcpu`'s guest takes VS interrupt `i`: its handler's instructions.
    fn take(&mut self, vcpu: usize, i: u32) {
        let h = self.home[vcpu];
        match i {
            irq::VSEI => {
                let chip = self.scheme.guest_irqchip();
                let id = match chip {
                    GuestIrqchip::Imsic => match self.m.harts[h].vs_csr(VsCsr::Stopei) {
                        VsOutcome::Executes => {
                            let g = self.m.harts[h].vgein();
                            self.m.imsics[h].guest_mut(g).map_or(0, |f| f.claim())
                        }
                        VsOutcome::VirtualInstruction => {
                            self.exit(vcpu, RiscvExit::VirtualInsn(VirtInsn::StopeiClaim));
                            self.vcpus[vcpu].claimed
                        }
                    },
                    GuestIrqchip::Plic => {
                        let gpa = plic_claim_complete(self.vcpus[vcpu].index);
                        let load = RiscvExit::GuestPageFault {
                            store: false,
                            gpa,
                            data: 0,
                        };
                        self.exit(vcpu, load);
                        self.vcpus[vcpu].claimed
                    }
                };
                if id != 0 {
                    self.handled.push((vcpu, Handled::External(id)));
                }
                if chip == GuestIrqchip::Plic && id != 0 {
                    let gpa = plic_claim_complete(self.vcpus[vcpu].index);
                    let complete = RiscvExit::GuestPageFault {
                        store: true,
                        gpa,
                        data: id,
                    };
                    self.exit(vcpu, complete);
                }
            }
            irq::VSSI => {
                // `csrc sip, SSIP`: in VS mode an alias of hvip.VSSIP.
                self.m.harts[h].set_hvip(irq::VSSI, false);
                self.handled.push((vcpu, Handled::Software));
            }
            _ => {
                // riscv_timer_interrupt masks its interrupt (`csr_clear
                // sie, STIE`: `vsie` in VS mode, no trap); VSTIP stays
                // until the next programming moves the compare (or KVM's
                // set_timer clears `hvip.VSTIP`).
                self.m.harts[h].vsie &= !(1 << irq::VSTI);
                self.handled.push((vcpu, Handled::Timer));
            }
        }
    }

    /// The guest's `riscv_clock_next_event` (Linux
    /// drivers/clocksource/timer-riscv.c): `stimecmp` with Sstc (a
    /// virtual instruction without STCE), else the SBI call.
    fn program_timer(&mut self, vcpu: usize, at: u64) {
        let h = self.home[vcpu];
        // riscv_clock_next_event unmasks the timer first (`csr_set sie,
        // STIE`).
        self.m.harts[h].vsie |= 1 << irq::VSTI;
        if self.scheme.sstc() {
            match self.m.harts[h].vs_csr(VsCsr::Stimecmp) {
                VsOutcome::Executes => self.m.harts[h].vstimecmp = at,
                VsOutcome::VirtualInstruction => {
                    let e = RiscvExit::VirtualInsn(VirtInsn::Stimecmp { value: at });
                    self.exit(vcpu, e)
                }
            }
        } else {
            self.exit(vcpu, RiscvExit::Sbi(SbiCall::SetTimer { stime: at }));
        }
    }

    /// Time moves to `to`: KVM's hrtimers due fire (an STI for the host,
    /// an exit where a guest runs on that hart).
    fn advance(&mut self, to: u64) {
        self.now = self.now.max(to);
        for v in 0..self.vcpus.len() {
            if self.vcpus[v].timer.is_some_and(|t| t <= self.now) {
                let h = self.home[v];
                if let Some(r) = self.running[h] {
                    self.exits.push((r, RiscvExit::Interrupt { irq: irq::STI }));
                }
                let (mut cx, scheme) = self.cx();
                scheme.timer_fired(&mut cx, v);
                if let Some(r) = self.running[h] {
                    self.kicks &= !(1 << r);
                    self.flush(r);
                }
            }
        }
    }

    /// Runs `ev` to quiescence; the exits it took, by vCPU.
    pub fn step(&mut self, ev: GuestEvent) -> &[(usize, RiscvExit)] {
        self.exits.clear();
        self.handled.clear();
        match ev {
            GuestEvent::TimerProgram { vcpu, at } => {
                self.enter(vcpu);
                self.exits.clear();
                self.program_timer(vcpu, at);
            }
            GuestEvent::TimerExpiry { vcpu } => {
                let h = self.home[vcpu];
                let at = if self.scheme.sstc() && self.running[h] == Some(vcpu) {
                    self.m.harts[h].vstimecmp
                } else if self.scheme.sstc() && self.vcpus[vcpu].timer.is_none() {
                    self.vcpus[vcpu].saved.vstimecmp
                } else {
                    self.vcpus[vcpu].timer.unwrap_or(self.now)
                };
                self.advance(at);
            }
            GuestEvent::Device { vcpu } => {
                self.vf_target = vcpu;
                let gpa = GStage::guest_page(self.vcpus[vcpu].index);
                let (t, _) = self.m.device_msi(0, gpa, ids::GUEST_VF);
                match t {
                    MsiTranslation::Untranslated => {
                        // The host's own MSI, aimed at the vCPU's hart.
                        let a = self.m.params.file_address(self.home[vcpu], 0);
                        self.m.store(a, ids::HOST_VF_BASE);
                    }
                    MsiTranslation::Fault => self.msi_faults += 1,
                    _ => {}
                }
            }
            GuestEvent::Ipi { from, to } => match self.scheme.guest_irqchip() {
                GuestIrqchip::Imsic => {
                    let gpa = GStage::guest_page(self.vcpus[to].index);
                    let r = {
                        let (mut cx, _) = self.cx();
                        cx.guest_store(0, gpa, ids::GUEST_IPI)
                    };
                    if let Err(e) = r {
                        self.exit(from, e);
                    }
                }
                GuestIrqchip::Plic => {
                    let mask = 1 << self.vcpus[to].index;
                    self.exit(from, RiscvExit::Sbi(SbiCall::SendIpi { mask }));
                }
            },
            GuestEvent::Idle { vcpu } => {
                let h = self.home[vcpu];
                if self.running[h] == Some(vcpu)
                    && self.m.harts[h].wfi() == VsOutcome::VirtualInstruction
                {
                    self.exit(vcpu, RiscvExit::VirtualInsn(VirtInsn::Wfi));
                }
            }
        }
        self.settle();
        &self.exits
    }

    /// The host scheduler takes `vcpu`'s hart for another thread
    /// (kvm_arch_vcpu_put of a runnable vCPU).
    pub fn preempt(&mut self, vcpu: usize) {
        if self.is_running(vcpu) {
            self.put(vcpu, false);
        }
        self.exits.clear();
        self.handled.clear();
        self.settle();
    }

    /// `vcpu`'s thread runs again, on `hart` (a migration if that is not
    /// its last), and whatever is pending for it is taken.
    pub fn resume_on(&mut self, vcpu: usize, hart: usize) {
        if self.is_running(vcpu) {
            self.put(vcpu, false);
        }
        self.home[vcpu] = hart;
        self.exits.clear();
        self.handled.clear();
        self.enter(vcpu);
        self.settle();
    }

    /// The handlers the last event ran.
    pub fn handled(&self) -> &[(usize, Handled)] {
        &self.handled
    }
}

mod timed;
pub(in crate::world) use timed::HsWorld;

#[cfg(test)]
mod tests;
