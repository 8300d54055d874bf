//! Schemes that drive the RISC-V hardware (`hw::riscv`): KVM RISC-V with
//! the AIA (`kvm-riscv`: a guest interrupt file per vCPU, AUTO mode's
//! software file when a hart has none free, Sstc or the SBI timer),
//! KVM RISC-V without the AIA (`kvm-riscv-sw`: an emulated PLIC, every
//! claim and completion an exit) and DID's ideas on RISC-V (`did-riscv`).
//! The sibling of `hv::x86` and `hv::arm`: a scheme implements
//! [`RiscvScheme`] and acts only through [`RiscvCx`] (the harts'
//! H-extension CSRs, the IMSICs' files, the G-stage mappings of the
//! guests' IMSIC windows, the IOMMU's MSI page tables). docs/riscv.md is
//! the specification and argues each scheme's correctness conditions.

pub mod did_riscv;
pub mod kvm_riscv;
pub mod kvm_riscv_sw;

use crate::engine::Time;
use crate::hw::riscv::hart::{irq, VS_BITS};
use crate::hw::riscv::imsic::InterruptFile;
use crate::hw::riscv::machine::{Landed, RiscvMachine};

/// The RISC-V schemes, by name.
pub const RISCV_SCHEMES: [&str; 3] = ["kvm-riscv", "kvm-riscv-sw", "did-riscv"];

/// One line each, in [`RISCV_SCHEMES`] order.
pub const RISCV_SCHEME_SUMMARIES: [&str; 3] = [
    "KVM RISC-V with the AIA (Linux 6.x, aia=auto): a guest interrupt file per vCPU on its hart (hstatus.VGEIN), SGEI wake-up of a blocked vCPU (hgeie/hgeip), the file moved on migration, a software file when the hart has none free; Sstc's vstimecmp or the SBI timer (hv.sstc)",
    "KVM RISC-V without the AIA: an emulated PLIC (every claim and completion an MMIO exit), SBI IPIs, hvip injection",
    "DID on RISC-V: dedicated harts, each vCPU's guest file fixed on its hart, WFI untrapped (VTW = 0), Sstc timer, IMSIC IPIs between dedicated harts, the VF's MSI into the guest file through the IOMMU's MSI page table (flat mode)",
];

/// The scheme `name` with `cfg`.
pub fn by_name(name: &str, cfg: RiscvConfig) -> Option<Box<dyn RiscvScheme>> {
    Some(match name {
        "kvm-riscv" => Box::new(kvm_riscv::KvmRiscv::new(cfg)),
        "kvm-riscv-sw" => Box::new(kvm_riscv_sw::KvmRiscvSw::new(cfg)),
        "did-riscv" => Box::new(did_riscv::DidRiscv::new()),
        _ => return None,
    })
}

/// The interrupt identities the guests and the host use (Linux's IMSIC
/// driver gives IPIs identity 1 and MSIs the next free ones).
pub mod ids {
    /// The guest's IPI (its IMSIC driver's `IMSIC_IPI_ID`); with a PLIC
    /// the guest IPIs by the SBI instead.
    pub const GUEST_IPI: u32 = 1;
    /// The guest's identity (PLIC source, with a PLIC) for its VF's MSI.
    pub const GUEST_VF: u32 = 8;
    /// The host's IPI in its S file (the kick of a vCPU in VS mode).
    pub const HOST_IPI: u32 = 1;
    /// The host's identity for VM `vm`'s VF MSI: this plus `vm`.
    pub const HOST_VF_BASE: u32 = 16;
}

/// How the VM's interrupt controller appears to its guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestIrqchip {
    /// An IMSIC per vCPU (the AIA): claims through `stopei`, IPIs by
    /// stores to a sibling's IMSIC page, no EOI.
    Imsic,
    /// A PLIC (no AIA): claims and completions through its MMIO
    /// claim/complete register, IPIs by the SBI.
    Plic,
}

/// The host's choices a RISC-V scheme reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RiscvConfig {
    /// The harts implement Sstc and KVM gives it to the guest
    /// (`henvcfg.STCE`); off: the guest's timer is the SBI set_timer call.
    pub no_sstc: bool,
    /// A deliberately wrong guest-file migration that reads and clears the
    /// old file but does not OR its pending bits into the new one (the
    /// race explorer must report the lost interrupt).
    pub migrate_drop_pending: bool,
}

/// The primitive costs of the RISC-V host (calibration/riscv-kvm-host.toml).
#[derive(Clone, Copy, Debug, Default)]
pub struct RiscvCosts {
    /// One trap to HS mode and the sret back (the world switch of
    /// `__kvm_riscv_switch_to` both ways).
    pub world_switch: Time,
    /// Decoding a virtual-instruction trap (`kvm_riscv_vcpu_virtual_insn`).
    pub insn_decode: Time,
    /// Emulating one access to a software interrupt file (`vstopei` claim,
    /// an `seteipnum` store): `kvm_riscv_vcpu_aia_imsic_rmw` and friends.
    pub swfile_emulate: Time,
    /// An SBI call's dispatch (`kvm_riscv_vcpu_sbi_ecall`).
    pub sbi_call: Time,
    /// An MMIO guest-page fault's decode and the in-kernel device's
    /// emulation (`kvm_riscv_vcpu_mmio_store`/`load`).
    pub mmio_emulate: Time,
    /// Emulating one PLIC access in the VMM (a KVM_EXIT_MMIO round trip
    /// to userspace).
    pub plic_emulate: Time,
    /// Moving a guest file: allocate, clear, G-stage remap, read-and-clear
    /// the old file, OR into the new (`kvm_riscv_vcpu_aia_imsic_update`).
    pub vsfile_move: Time,
    /// A host interrupt's entry and handler (SGEI, SEI, STI).
    pub host_irq: Time,
    /// Waking a blocked vCPU thread.
    pub vcpu_wakeup: Time,
    /// An MSI's flight from the device or a hart to an interrupt file.
    pub msi_latency: Time,
}

/// Where a vCPU's interrupt-file state lives (KVM's `vsfile_cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileHome {
    /// Guest file `g` of hart `hart`'s IMSIC.
    Hw {
        /// The hart.
        hart: usize,
        /// The guest file (1..=GEILEN).
        g: usize,
    },
    /// KVM's software file (`imsic->swfile`), in memory.
    Sw,
}

/// A vCPU's VS-level CSRs while it is not loaded on a hart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedCsrs {
    /// `vsie`.
    pub vsie: u64,
    /// `hvip`.
    pub hvip: u64,
    /// `vstimecmp`.
    pub vstimecmp: u64,
}

/// KVM RISC-V's per-vCPU state.
#[derive(Clone, Debug)]
pub struct RiscvVcpu {
    /// Its VM.
    pub vm: usize,
    /// Its index in the VM (its guest IMSIC page).
    pub index: usize,
    /// The hart it is loaded on.
    pub hart: Option<usize>,
    /// Where its interrupt file is.
    pub file: FileHome,
    /// Its software file (AUTO mode's fallback; `kvm-riscv-sw`'s emulated
    /// PLIC context keeps its pending and enable bits here too).
    pub swfile: InterruptFile,
    /// Its CSRs while off a hart.
    pub saved: SavedCsrs,
    /// KVM's hrtimer for it, in `time` ticks: the SBI timer's deadline,
    /// or (Sstc) `vstimecmp` while it is blocked.
    pub timer: Option<u64>,
    /// The identity an emulated claim returned, for the guest's handler.
    pub claimed: u32,
    /// Blocked in WFI.
    pub blocked: bool,
}

impl RiscvVcpu {
    /// vCPU `index` of VM `vm`, with files of `ids` identities.
    pub fn new(vm: usize, index: usize, ids: u32) -> Self {
        RiscvVcpu {
            vm,
            index,
            hart: None,
            file: FileHome::Sw,
            swfile: InterruptFile::new(ids),
            saved: SavedCsrs {
                vsie: 0,
                hvip: 0,
                vstimecmp: u64::MAX,
            },
            timer: None,
            claimed: 0,
            blocked: false,
        }
    }
}

/// An instruction whose virtual-instruction trap a scheme handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtInsn {
    /// WFI with `hstatus.VTW`.
    Wfi,
    /// `csrrw vstopei` with no guest file selected (a claim).
    StopeiClaim,
    /// A `stimecmp` write without STCE.
    Stimecmp {
        /// The value.
        value: u64,
    },
}

/// An SBI call (ecall from VS mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SbiCall {
    /// TIME extension `sbi_set_timer`.
    SetTimer {
        /// The deadline, in `time` ticks.
        stime: u64,
    },
    /// IPI extension `sbi_send_ipi` to the VM's vCPUs in the mask (by
    /// index).
    SendIpi {
        /// The hart mask.
        mask: u64,
    },
}

/// A trap from VS mode to HS mode (an exit), as `scause` reports it to
/// `kvm_riscv_vcpu_exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RiscvExit {
    /// An interrupt for HS mode (SEI, STI, SSI, SGEI).
    Interrupt {
        /// The interrupt number.
        irq: u32,
    },
    /// A virtual-instruction exception (scause 22).
    VirtualInsn(VirtInsn),
    /// An ecall from VS mode (scause 10).
    Sbi(SbiCall),
    /// A load (21) or store (23) guest-page fault.
    GuestPageFault {
        /// A store.
        store: bool,
        /// The guest-physical address.
        gpa: u64,
        /// The value stored.
        data: u32,
    },
}

/// [`RiscvExit`] without its data: the per-reason accounting key, as
/// `perf kvm stat` on riscv names the scause codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RiscvExitReason {
    /// An interrupt.
    Interrupt,
    /// EXC_VIRTUAL_INST_FAULT.
    VirtualInsn,
    /// EXC_SUPERVISOR_SYSCALL (an SBI call).
    Sbi,
    /// EXC_LOAD_GUEST_PAGE_FAULT / EXC_STORE_GUEST_PAGE_FAULT.
    GuestPageFault,
}

impl RiscvExitReason {
    /// Every reason, in report order.
    pub const ALL: [RiscvExitReason; 4] = [
        RiscvExitReason::Interrupt,
        RiscvExitReason::VirtualInsn,
        RiscvExitReason::Sbi,
        RiscvExitReason::GuestPageFault,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            RiscvExitReason::Interrupt => "IRQ",
            RiscvExitReason::VirtualInsn => "VIRTUAL_INST",
            RiscvExitReason::Sbi => "SBI_ECALL",
            RiscvExitReason::GuestPageFault => "GUEST_PAGE_FAULT",
        }
    }
}

impl RiscvExit {
    /// Its reason.
    pub fn reason(self) -> RiscvExitReason {
        match self {
            RiscvExit::Interrupt { .. } => RiscvExitReason::Interrupt,
            RiscvExit::VirtualInsn(_) => RiscvExitReason::VirtualInsn,
            RiscvExit::Sbi(_) => RiscvExitReason::Sbi,
            RiscvExit::GuestPageFault { .. } => RiscvExitReason::GuestPageFault,
        }
    }
}

/// What an exit's handler leaves the vCPU to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Enter the guest again.
    Resume,
    /// Halt (WFI): block until something is pending for it.
    Halt,
}

/// The state a scheme drives, with the time and a work meter.
pub struct RiscvCx<'a> {
    /// Now, in `time` ticks.
    pub now: u64,
    /// The hardware.
    pub m: &'a mut RiscvMachine,
    /// KVM's per-vCPU state (all VMs').
    pub vcpus: &'a mut [RiscvVcpu],
    /// Costs.
    pub costs: &'a RiscvCosts,
    /// vCPUs to kick (bit v).
    pub kicks: &'a mut u64,
    /// Work charged so far by this call.
    pub charged: Time,
}

impl RiscvCx<'_> {
    /// Charges `t` of host work.
    pub fn charge(&mut self, t: Time) {
        self.charged += t;
    }

    /// kvm_vcpu_kick.
    pub fn kick(&mut self, vcpu: usize) {
        *self.kicks |= 1 << vcpu;
    }

    /// The vCPU of VM `vm` with index `index`.
    pub fn vcpu_of(&self, vm: usize, index: usize) -> Option<usize> {
        self.vcpus
            .iter()
            .position(|v| v.vm == vm && v.index == index)
    }

    /// `vcpu`'s CSR view: the hart's if loaded, else the saved copy.
    fn set_vs_irq(&mut self, vcpu: usize, irq: u32, on: bool) {
        match self.vcpus[vcpu].hart {
            Some(h) => self.m.harts[h].set_hvip(irq, on),
            None => {
                let b = 1u64 << irq;
                let s = &mut self.vcpus[vcpu].saved;
                s.hvip = if on { s.hvip | b } else { s.hvip & !b };
            }
        }
    }

    /// Makes VS interrupt `irq` pending for `vcpu` through `hvip`
    /// (kvm_riscv_vcpu_set_interrupt) and kicks it.
    pub fn inject(&mut self, vcpu: usize, irq: u32) {
        self.set_vs_irq(vcpu, irq, true);
        self.kick(vcpu);
    }

    /// Clears VS interrupt `irq` of `vcpu` in `hvip`.
    pub fn retract(&mut self, vcpu: usize, irq: u32) {
        self.set_vs_irq(vcpu, irq, false);
    }

    /// Loads `vcpu`'s VS CSRs on `hart` (kvm_arch_vcpu_load's CSR half):
    /// VS interrupts delegated, its `vsie`, `hvip` and `vstimecmp`, STCE
    /// as `stce`, VTW as `vtw`, VGEIN its file's if that is on this hart.
    pub fn load_csrs(&mut self, vcpu: usize, hart: usize, stce: bool, vtw: bool) {
        let v = &mut self.vcpus[vcpu];
        v.hart = Some(hart);
        let h = &mut self.m.harts[hart];
        h.hideleg = VS_BITS;
        h.vsie = v.saved.vsie;
        h.hvip = v.saved.hvip;
        h.vstimecmp = v.saved.vstimecmp;
        h.set_stce(stce);
        h.set_vtw(vtw);
        h.set_vgein(match v.file {
            FileHome::Hw { hart: fh, g } if fh == hart => g,
            _ => 0,
        });
    }

    /// Saves `vcpu`'s VS CSRs off its hart (kvm_arch_vcpu_put); the hart
    /// keeps no guest state (VGEIN 0, nothing in `hvip`, `vstimecmp` at
    /// its maximum).
    pub fn save_csrs(&mut self, vcpu: usize) {
        let Some(hart) = self.vcpus[vcpu].hart.take() else {
            return;
        };
        let h = &mut self.m.harts[hart];
        self.vcpus[vcpu].saved = SavedCsrs {
            vsie: h.vsie,
            hvip: h.hvip,
            vstimecmp: h.vstimecmp,
        };
        h.hvip = 0;
        h.vstimecmp = u64::MAX;
        h.set_vgein(0);
    }

    /// `vcpu`'s interrupt file, wherever it is.
    pub fn file(&mut self, vcpu: usize) -> &mut InterruptFile {
        match self.vcpus[vcpu].file {
            FileHome::Hw { hart, g } => self.m.imsics[hart]
                .guest_mut(g)
                .expect("a guest file the vCPU owns exists"),
            FileHome::Sw => &mut self.vcpus[vcpu].swfile,
        }
    }

    /// Whether `vcpu`'s interrupt file signals (delivery on, an identity
    /// above none of its threshold pending and enabled).
    pub fn file_signals(&self, vcpu: usize) -> bool {
        match self.vcpus[vcpu].file {
            FileHome::Hw { hart, g } => self.m.imsics[hart].guest(g).is_some_and(|f| f.signals()),
            FileHome::Sw => self.vcpus[vcpu].swfile.signals(),
        }
    }

    /// KVM's `kvm_riscv_vcpu_aia_imsic_inject`: identity `eiid` for
    /// `vcpu`. With a guest file, the host's store to its `seteipnum` (the
    /// hardware signals VS mode or an SGEI); with the software file, the
    /// bit in memory, then a kick (the entry sets `hvip.VSEIP`).
    pub fn imsic_inject(&mut self, vcpu: usize, eiid: u32) {
        match self.vcpus[vcpu].file {
            FileHome::Hw { hart, g } => {
                let addr = self.m.params.file_address(hart, g);
                let _ = self.m.store(addr, eiid);
            }
            FileHome::Sw => {
                self.vcpus[vcpu].swfile.setipnum(eiid);
                self.kick(vcpu);
            }
        }
    }

    /// Whether anything is pending for halted `vcpu`
    /// (kvm_arch_vcpu_runnable → kvm_riscv_vcpu_has_interrupts): its
    /// file, or a VS interrupt pending in `hvip` (the timer's, with Sstc,
    /// from `vstimecmp` against now) that the guest's `vsie` enables.
    pub fn vcpu_runnable(&self, vcpu: usize, stce: bool) -> bool {
        let v = &self.vcpus[vcpu];
        let (hvip, cmp, vsie) = match v.hart {
            Some(h) => {
                let c = &self.m.harts[h];
                (c.hvip, c.vstimecmp, c.vsie)
            }
            None => (v.saved.hvip, v.saved.vstimecmp, v.saved.vsie),
        };
        let mut pending = hvip & VS_BITS;
        if stce && self.now >= cmp {
            pending |= 1 << irq::VSTI;
        }
        self.file_signals(vcpu) || pending & vsie != 0
    }

    /// The guest file hart `hart` has free (none owned by a vCPU), lowest
    /// first (kvm_riscv_aia_alloc_hgei).
    pub fn free_guest_file(&self, hart: usize) -> Option<usize> {
        let files = self.m.imsics[hart].guest_files();
        (1..=files).find(|&g| {
            !self
                .vcpus
                .iter()
                .any(|v| v.file == FileHome::Hw { hart, g })
        })
    }

    /// The vCPU that owns guest file `g` of `hart`.
    pub fn owner_of(&self, hart: usize, g: usize) -> Option<usize> {
        self.vcpus
            .iter()
            .position(|v| v.file == FileHome::Hw { hart, g })
    }

    /// Moves `vcpu`'s file to `to` (KVM's `kvm_riscv_vcpu_aia_imsic_update`
    /// on a new hart): the new file is cleared, the G-stage page of the
    /// vCPU's guest IMSIC window remapped to it (unmapped for the software
    /// file, so the guest's stores to it fault and are emulated), the old
    /// file's configuration copied and its pending bits read and cleared,
    /// then ORed into the new one (unless `drop_pending`: the defect the
    /// race explorer must catch).
    pub fn move_file(&mut self, vcpu: usize, to: FileHome, drop_pending: bool) {
        let from = self.vcpus[vcpu].file;
        if from == to {
            return;
        }
        let words = self.vcpus[vcpu].swfile.words();
        let mut bits = [0u64; 32];
        let bits = &mut bits[..words.min(32)];
        let (deliv, thresh, mut eie) = {
            let f = self.file(vcpu);
            let (d, t, e) = f.config();
            let mut copy = [0u64; 32];
            copy[..e.len().min(32)].copy_from_slice(&e[..e.len().min(32)]);
            (d, t, copy)
        };
        {
            let f = self.file(vcpu);
            f.take_pending(bits);
            f.clear();
        }
        self.vcpus[vcpu].file = to;
        let (vm, index) = (self.vcpus[vcpu].vm, self.vcpus[vcpu].index);
        let host = match to {
            FileHome::Hw { hart, g } => Some(self.m.params.file_address(hart, g)),
            FileHome::Sw => None,
        };
        self.m.gstage.map(vm, index, host);
        let f = self.file(vcpu);
        f.clear();
        f.set_config(deliv, thresh, &eie[..words.min(32)]);
        if !drop_pending {
            f.or_pending(bits);
        }
        eie.fill(0);
        self.charge(self.costs.vsfile_move);
    }

    /// A guest store of `data` to guest-physical `gpa` of VM `vm` (an
    /// IPI: the target vCPU's `seteipnum`) as the G-stage resolves it:
    /// into the mapped interrupt file (no exit; the hart or file it
    /// landed in), or a store guest-page fault.
    pub fn guest_store(&mut self, vm: usize, gpa: u64, data: u32) -> Result<Landed, RiscvExit> {
        match self.m.gstage.translate(vm, gpa) {
            Some((_, Some(host))) => Ok(self.m.store(host, data)),
            Some((_, None)) => Err(RiscvExit::GuestPageFault {
                store: true,
                gpa,
                data,
            }),
            None => Ok(Landed::Elsewhere),
        }
    }
}

/// The hooks of a RISC-V interrupt-delivery scheme.
pub trait RiscvScheme {
    /// Its name.
    fn name(&self) -> &'static str;
    /// Creates VM `vm`, its VF (IOMMU device context `vf`) if it has one.
    fn setup_vm(&mut self, cx: &mut RiscvCx, vm: usize, vf: Option<usize>);
    /// kvm_arch_vcpu_load of `vcpu` on `hart`.
    fn vcpu_load(&mut self, cx: &mut RiscvCx, vcpu: usize, hart: usize);
    /// kvm_arch_vcpu_put: `vcpu` leaves its hart, blocking in WFI
    /// (`blocking`) or preempted.
    fn vcpu_put(&mut self, cx: &mut RiscvCx, vcpu: usize, blocking: bool);
    /// kvm_riscv_vcpu_exit.
    fn handle_exit(&mut self, cx: &mut RiscvCx, vcpu: usize, exit: RiscvExit) -> ExitAction;
    /// The host took interrupt `irq` (SGEI, SEI) on `hart`.
    fn host_irq(&mut self, cx: &mut RiscvCx, hart: usize, irq: u32);
    /// VM `vm`'s VF sent MSI `eiid` for `vcpu` and the IOMMU did not post
    /// it into a guest file: the host's irqfd delivers it.
    fn device_msi(&mut self, cx: &mut RiscvCx, vcpu: usize, eiid: u32);
    /// Before entering `vcpu` (the software file's `hvip.VSEIP`).
    fn flush(&mut self, cx: &mut RiscvCx, vcpu: usize);
    /// KVM's hrtimer for `vcpu` fired.
    fn timer_fired(&mut self, cx: &mut RiscvCx, vcpu: usize);
    /// kvm_arch_vcpu_runnable.
    fn has_pending(&self, cx: &RiscvCx, vcpu: usize) -> bool;
    /// Whether the guest's timer is `vstimecmp` (Sstc given to it).
    fn sstc(&self) -> bool;
    /// The interrupt controller the VM's device tree describes.
    fn guest_irqchip(&self) -> GuestIrqchip {
        GuestIrqchip::Imsic
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hw_names {
    use super::RISCV_SCHEMES;

    /// A scheme acts through the hardware's interfaces: no RISC-V scheme
    /// is named in `hw::riscv`.
    #[test]
    fn no_scheme_name_in_the_riscv_hardware() {
        let files = [
            include_str!("../../hw/riscv/mod.rs"),
            include_str!("../../hw/riscv/aplic.rs"),
            include_str!("../../hw/riscv/gstage.rs"),
            include_str!("../../hw/riscv/hart.rs"),
            include_str!("../../hw/riscv/imsic.rs"),
            include_str!("../../hw/riscv/iommu.rs"),
            include_str!("../../hw/riscv/machine.rs"),
            include_str!("../../hw/riscv/params.rs"),
        ];
        for f in files {
            for name in RISCV_SCHEMES {
                assert!(!f.contains(name), "{name} named in hw::riscv");
            }
        }
    }
}
