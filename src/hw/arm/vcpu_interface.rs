//! The GICv3 virtual CPU interface of one vCPU and its EL2 control
//! registers (GICv3 spec §6 "Virtual interrupt handling and prioritization",
//! §12.4/§12.5 ICH_*/ICV_* registers; did-arm.md §2.3 and §7.6;
//! kvm-arm-and-peers.md §2 "LR encoding").
//!
//! The hypervisor makes a virtual interrupt pending by writing a list
//! register (`ICH_LR<n>_EL2`: vINTID, state, priority, group, and with HW = 1
//! the physical INTID it stands for). While the vCPU runs with
//! HCR_EL2.IMO = 1, its ICC_IAR1/EOIR1/DIR/PMR... accesses go to this
//! interface as ICV_* accesses, without trapping: the accessor (the guest
//! at EL1) decides, see [`crate::hw::arm::el2`]. The guest acknowledges the
//! best list register (or, with GICv4, the best vLPI of the resident vPE),
//! and its EOI deactivates the list register — and with HW = 1 the physical
//! INTID too, in the physical distributor or redistributor, with no exit.
//!
//! ICH_HCR_EL2 enables the interface and the maintenance interrupt (PPI 25)
//! reasons reported in ICH_MISR_EL2: underflow (UIE, at most one valid LR),
//! no pending LR (NPIE), EOIs with no LR to match (LRENPIE, counted in
//! EOIcount), and EOI maintenance of LRs with the EOI bit (EISR).
//!
//! The state here is the per-vCPU copy KVM saves and restores around each
//! run; while the vCPU runs it is what the core's ICH registers hold.

use crate::hw::arm::cpu_interface::deactivate;
use crate::hw::arm::distributor::Distributor;
use crate::hw::arm::intid::{class, GicError, IntidClass, LPI_BASE, PPI_BASE, SPURIOUS};
use crate::hw::arm::params::GicParams;
use crate::hw::arm::priority::{Candidate, Group, PriorityControl};
use crate::hw::arm::redistributor::{DirectVlpis, Redistributor};

/// `ICH_LR<n>_EL2` field layout.
pub mod lr {
    /// vINTID, bits \[31:0\].
    pub const VINTID: u64 = 0xFFFF_FFFF;
    /// pINTID shift (bits \[44:32\], with HW = 1).
    pub const PINTID_SHIFT: u32 = 32;
    /// pINTID mask after the shift.
    pub const PINTID_MASK: u64 = 0x1FFF;
    /// EOI maintenance request (bit 41, with HW = 0).
    pub const EOI: u64 = 1 << 41;
    /// Priority shift (bits \[55:48\]).
    pub const PRIORITY_SHIFT: u32 = 48;
    /// Group: 1 = group 1.
    pub const GROUP: u64 = 1 << 60;
    /// HW: the virtual interrupt stands for the physical pINTID.
    pub const HW: u64 = 1 << 61;
    /// State shift (bits \[63:62\]).
    pub const STATE_SHIFT: u32 = 62;
    /// Bits \[58:56\] and \[47:45\] are RES0 (bit 59, NMI, is not implemented).
    pub const RES0: u64 = (0xF << 56) | (0x7 << 45);
}

/// ICH_HCR_EL2 bits.
pub mod hcr {
    /// En: the virtual CPU interface is enabled.
    pub const EN: u64 = 1 << 0;
    /// UIE: maintenance interrupt on underflow.
    pub const UIE: u64 = 1 << 1;
    /// LRENPIE: maintenance interrupt while EOIcount is non-zero.
    pub const LRENPIE: u64 = 1 << 2;
    /// NPIE: maintenance interrupt while no LR is pending.
    pub const NPIE: u64 = 1 << 3;
    /// VGrp0EIE.
    pub const VGRP0EIE: u64 = 1 << 4;
    /// VGrp0DIE.
    pub const VGRP0DIE: u64 = 1 << 5;
    /// VGrp1EIE.
    pub const VGRP1EIE: u64 = 1 << 6;
    /// VGrp1DIE.
    pub const VGRP1DIE: u64 = 1 << 7;
    /// vSGIEOICount (GICv4.1): direct vSGI deactivations do not count.
    pub const VSGIEOICOUNT: u64 = 1 << 8;
    /// TC: trap EL1 accesses to the common registers.
    pub const TC: u64 = 1 << 10;
    /// TALL0: trap EL1 accesses to the group-0 registers.
    pub const TALL0: u64 = 1 << 11;
    /// TALL1: trap EL1 accesses to the group-1 registers.
    pub const TALL1: u64 = 1 << 12;
    /// TDIR: trap EL1 writes to ICC_DIR_EL1/ICV_DIR_EL1.
    pub const TDIR: u64 = 1 << 14;
    /// EOIcount shift (bits \[31:27\]).
    pub const EOICOUNT_SHIFT: u32 = 27;
    /// Every bit the model implements.
    pub const VALID: u64 = 0x1F << EOICOUNT_SHIFT
        | EN
        | UIE
        | LRENPIE
        | NPIE
        | VGRP0EIE
        | VGRP0DIE
        | VGRP1EIE
        | VGRP1DIE
        | VSGIEOICOUNT
        | TC
        | TALL0
        | TALL1
        | TDIR;
}

/// ICH_MISR_EL2 bits (maintenance interrupt reasons).
pub mod misr {
    /// EOI: some LR asked for EOI maintenance (ICH_EISR_EL2 non-zero).
    pub const EOI: u32 = 1 << 0;
    /// U: underflow.
    pub const U: u32 = 1 << 1;
    /// LRENP: EOIcount non-zero.
    pub const LRENP: u32 = 1 << 2;
    /// NP: no LR pending.
    pub const NP: u32 = 1 << 3;
    /// VGrp0E.
    pub const VGRP0E: u32 = 1 << 4;
    /// VGrp0D.
    pub const VGRP0D: u32 = 1 << 5;
    /// VGrp1E.
    pub const VGRP1E: u32 = 1 << 6;
    /// VGrp1D.
    pub const VGRP1D: u32 = 1 << 7;
}

/// ICH_VMCR_EL2 field layout.
pub mod vmcr {
    /// VENG0.
    pub const VENG0: u64 = 1 << 0;
    /// VENG1.
    pub const VENG1: u64 = 1 << 1;
    /// VAckCtl (stored only).
    pub const VACKCTL: u64 = 1 << 2;
    /// VFIQEn (stored only).
    pub const VFIQEN: u64 = 1 << 3;
    /// VCBPR.
    pub const VCBPR: u64 = 1 << 4;
    /// VEOIM.
    pub const VEOIM: u64 = 1 << 9;
    /// VBPR1 shift (bits \[20:18\]).
    pub const VBPR1_SHIFT: u32 = 18;
    /// VBPR0 shift (bits \[23:21\]).
    pub const VBPR0_SHIFT: u32 = 21;
    /// VPMR shift (bits \[31:24\]).
    pub const VPMR_SHIFT: u32 = 24;
    /// Every defined bit.
    pub const VALID: u64 = VENG0
        | VENG1
        | VACKCTL
        | VFIQEN
        | VCBPR
        | VEOIM
        | (7 << VBPR1_SHIFT)
        | (7 << VBPR0_SHIFT)
        | (0xFF << VPMR_SHIFT);
}

/// The state of a list register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LrState {
    /// 00: empty (or awaiting EOI maintenance, with the EOI bit).
    Invalid,
    /// 01.
    Pending,
    /// 10.
    Active,
    /// 11.
    PendingActive,
}

impl LrState {
    fn bits(self) -> u64 {
        match self {
            LrState::Invalid => 0,
            LrState::Pending => 1,
            LrState::Active => 2,
            LrState::PendingActive => 3,
        }
    }

    fn from_bits(b: u64) -> Self {
        match b & 3 {
            0 => LrState::Invalid,
            1 => LrState::Pending,
            2 => LrState::Active,
            _ => LrState::PendingActive,
        }
    }
}

/// One list register, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListRegister {
    /// The virtual INTID the guest sees.
    pub vintid: u32,
    /// Its state.
    pub state: LrState,
    /// HW = 1 with the physical INTID it stands for.
    pub hw: Option<u32>,
    /// HW = 0 only: ask for EOI maintenance when the guest deactivates it
    /// (KVM sets it for level-sensitive interrupts to resample the line).
    pub eoi_maintenance: bool,
    /// Its priority.
    pub priority: u8,
    /// Its group.
    pub group: Group,
}

impl ListRegister {
    /// An empty list register.
    pub const EMPTY: ListRegister = ListRegister {
        vintid: 0,
        state: LrState::Invalid,
        hw: None,
        eoi_maintenance: false,
        priority: 0,
        group: Group::G0,
    };

    /// A pending group-1 software interrupt.
    pub fn pending(vintid: u32, priority: u8) -> Self {
        ListRegister {
            vintid,
            state: LrState::Pending,
            priority,
            group: Group::G1,
            ..Self::EMPTY
        }
    }

    /// A pending group-1 interrupt tied to physical `pintid` (HW = 1).
    pub fn hardware(vintid: u32, pintid: u32, priority: u8) -> Self {
        ListRegister {
            hw: Some(pintid),
            ..Self::pending(vintid, priority)
        }
    }

    /// The `ICH_LR<n>_EL2` value.
    pub fn encode(&self) -> u64 {
        let link = match self.hw {
            Some(p) => lr::HW | ((u64::from(p) & lr::PINTID_MASK) << lr::PINTID_SHIFT),
            None if self.eoi_maintenance => lr::EOI,
            None => 0,
        };
        u64::from(self.vintid)
            | link
            | (u64::from(self.priority) << lr::PRIORITY_SHIFT)
            | if self.group == Group::G1 {
                lr::GROUP
            } else {
                0
            }
            | (self.state.bits() << lr::STATE_SHIFT)
    }

    /// Decodes an `ICH_LR<n>_EL2` value. Refused: RES0 bits; a vINTID in the
    /// special or unimplemented range; HW = 1 naming a pINTID that is not a
    /// PPI or SPI, or in the pending-and-active state (the combination KVM
    /// never writes, kvm-arm-and-peers.md §2); HW = 0 with pINTID bits
    /// other than EOI.
    pub fn decode(v: u64) -> Result<Self, GicError> {
        let bad = || GicError::Reserved {
            reg: "ICH_LR<n>_EL2",
            value: v,
        };
        if v & lr::RES0 != 0 {
            return Err(bad());
        }
        let vintid = (v & lr::VINTID) as u32;
        if matches!(class(vintid), IntidClass::Special | IntidClass::Reserved) {
            return Err(bad());
        }
        let state = LrState::from_bits(v >> lr::STATE_SHIFT);
        let pbits = (v >> lr::PINTID_SHIFT) & lr::PINTID_MASK;
        let (hw, eoi_maintenance) = if v & lr::HW != 0 {
            let p = pbits as u32;
            if !matches!(class(p), IntidClass::Ppi | IntidClass::Spi)
                || state == LrState::PendingActive
            {
                return Err(bad());
            }
            (Some(p), false)
        } else {
            if v & ((lr::PINTID_MASK << lr::PINTID_SHIFT) & !lr::EOI) != 0 {
                return Err(bad());
            }
            (None, v & lr::EOI != 0)
        };
        Ok(ListRegister {
            vintid,
            state,
            hw,
            eoi_maintenance,
            priority: (v >> lr::PRIORITY_SHIFT) as u8,
            group: Group::from_bit(v & lr::GROUP != 0),
        })
    }

    /// Whether it holds an interrupt (state not invalid).
    pub fn valid(&self) -> bool {
        self.state != LrState::Invalid
    }
}

/// ICH_HCR_EL2, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IchHcr {
    /// En.
    pub en: bool,
    /// UIE.
    pub uie: bool,
    /// LRENPIE.
    pub lrenpie: bool,
    /// NPIE.
    pub npie: bool,
    /// VGrp0EIE.
    pub vgrp0eie: bool,
    /// VGrp0DIE.
    pub vgrp0die: bool,
    /// VGrp1EIE.
    pub vgrp1eie: bool,
    /// VGrp1DIE.
    pub vgrp1die: bool,
    /// vSGIEOICount.
    pub vsgi_eoicount: bool,
    /// TC.
    pub tc: bool,
    /// TALL0.
    pub tall0: bool,
    /// TALL1.
    pub tall1: bool,
    /// TDIR.
    pub tdir: bool,
    /// EOIcount (5 bits).
    pub eoicount: u8,
}

impl IchHcr {
    /// Decodes a value; unimplemented bits are refused.
    pub fn decode(v: u64) -> Result<Self, GicError> {
        if v & !hcr::VALID != 0 {
            return Err(GicError::Reserved {
                reg: "ICH_HCR_EL2",
                value: v,
            });
        }
        let b = |m: u64| v & m != 0;
        Ok(IchHcr {
            en: b(hcr::EN),
            uie: b(hcr::UIE),
            lrenpie: b(hcr::LRENPIE),
            npie: b(hcr::NPIE),
            vgrp0eie: b(hcr::VGRP0EIE),
            vgrp0die: b(hcr::VGRP0DIE),
            vgrp1eie: b(hcr::VGRP1EIE),
            vgrp1die: b(hcr::VGRP1DIE),
            vsgi_eoicount: b(hcr::VSGIEOICOUNT),
            tc: b(hcr::TC),
            tall0: b(hcr::TALL0),
            tall1: b(hcr::TALL1),
            tdir: b(hcr::TDIR),
            eoicount: ((v >> hcr::EOICOUNT_SHIFT) & 0x1F) as u8,
        })
    }

    /// The register value.
    pub fn encode(&self) -> u64 {
        let f = |on: bool, m: u64| if on { m } else { 0 };
        f(self.en, hcr::EN)
            | f(self.uie, hcr::UIE)
            | f(self.lrenpie, hcr::LRENPIE)
            | f(self.npie, hcr::NPIE)
            | f(self.vgrp0eie, hcr::VGRP0EIE)
            | f(self.vgrp0die, hcr::VGRP0DIE)
            | f(self.vgrp1eie, hcr::VGRP1EIE)
            | f(self.vgrp1die, hcr::VGRP1DIE)
            | f(self.vsgi_eoicount, hcr::VSGIEOICOUNT)
            | f(self.tc, hcr::TC)
            | f(self.tall0, hcr::TALL0)
            | f(self.tall1, hcr::TALL1)
            | f(self.tdir, hcr::TDIR)
            | (u64::from(self.eoicount & 0x1F) << hcr::EOICOUNT_SHIFT)
    }
}

/// What a guest EOIR/DIR write did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtualEoi {
    /// The virtual priority dropped (EOIR only).
    pub dropped: Option<u8>,
    /// The list register deactivated, if one matched.
    pub deactivated_lr: Option<usize>,
    /// The physical INTID that list register stood for (HW = 1): the
    /// physical GIC must deactivate it.
    pub hw_deactivate: Option<u32>,
    /// No list register matched and EOIcount was incremented.
    pub eoicount_incremented: bool,
}

/// Where the interrupt a guest acknowledges comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Lr(usize),
    Direct,
}

/// Event counts of one virtual CPU interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuInterfaceCounters {
    /// Guest acknowledges of a list register.
    pub lr_acks: u64,
    /// Guest acknowledges of a directly injected vLPI/vSGI.
    pub direct_acks: u64,
    /// Acknowledges that returned 1023.
    pub spurious: u64,
    /// Guest EOIR writes.
    pub eois: u64,
    /// List registers deactivated by the guest.
    pub deactivations: u64,
    /// Of those, HW = 1 ones (physical deactivation without an exit).
    pub hw_deactivations: u64,
    /// EOIs/DIRs that found no list register (EOIcount increments).
    pub lr_not_present: u64,
    /// List registers written by the hypervisor.
    pub lr_writes: u64,
}

/// One vCPU's virtual CPU interface.
#[derive(Clone, Debug)]
pub struct VcpuInterface {
    lrs: Box<[ListRegister]>,
    hcr: IchHcr,
    prio: PriorityControl,
    vackctl: bool,
    vfiqen: bool,
    priority_bits: u8,
    gicv4: bool,
    counters: VcpuInterfaceCounters,
}

impl VcpuInterface {
    /// A vCPU interface in reset state: every LR empty, ICH_HCR_EL2 = 0
    /// (disabled), virtual PMR 0, groups disabled.
    pub fn new(params: &GicParams) -> Self {
        let n = params.vcpu_interface.list_registers.clamp(1, 16);
        let bits = params.vcpu_interface.priority_bits.clamp(5, 8);
        VcpuInterface {
            lrs: vec![ListRegister::EMPTY; usize::from(n)].into_boxed_slice(),
            hcr: IchHcr::default(),
            prio: PriorityControl::new(bits),
            vackctl: false,
            vfiqen: false,
            priority_bits: bits,
            gicv4: params.gicv4,
            counters: VcpuInterfaceCounters::default(),
        }
    }

    /// What KVM sets for a running vCPU of a Linux guest: En, VENG1, a
    /// virtual PMR of 0xF0 (the guest's own), EOImode 0.
    pub fn kvm_linux_guest(mut self) -> Self {
        self.hcr.en = true;
        self.prio.set_group_enabled(Group::G1, true);
        self.prio.set_pmr(0xF0);
        self
    }

    /// Number of list registers (ICH_VTR_EL2.ListRegs + 1).
    pub fn list_registers(&self) -> usize {
        self.lrs.len()
    }

    /// Event counts so far.
    pub fn counters(&self) -> VcpuInterfaceCounters {
        self.counters
    }

    /// The virtual priority state (VPMR, VBPRs, VEOIM, VENGs, active
    /// priorities).
    pub fn priority(&self) -> &PriorityControl {
        &self.prio
    }

    /// ICH_VTR_EL2: ListRegs, TDS, nV4, A3V, IDbits (24), PREbits, PRIbits.
    pub fn vtr(&self) -> u64 {
        let pre = u64::from(self.priority_bits.min(7));
        (self.lrs.len() as u64 - 1)
            | (1 << 19)
            | (u64::from(!self.gicv4) << 20)
            | (1 << 21)
            | (1 << 23)
            | ((pre - 1) << 26)
            | (u64::from(self.priority_bits - 1) << 29)
    }

    /// List register `n`, decoded.
    pub fn lr(&self, n: usize) -> Result<ListRegister, GicError> {
        self.lrs.get(n).copied().ok_or(GicError::ListRegister(n))
    }

    /// Writes list register `n`.
    pub fn set_lr(&mut self, n: usize, value: ListRegister) -> Result<(), GicError> {
        let slot = self.lrs.get_mut(n).ok_or(GicError::ListRegister(n))?;
        *slot = value;
        self.counters.lr_writes += 1;
        Ok(())
    }

    /// `ICH_LR<n>_EL2` read.
    pub fn read_lr(&self, n: usize) -> Result<u64, GicError> {
        self.lr(n).map(|l| l.encode())
    }

    /// `ICH_LR<n>_EL2` write (decoded and checked).
    pub fn write_lr(&mut self, n: usize, v: u64) -> Result<(), GicError> {
        let l = ListRegister::decode(v)?;
        self.set_lr(n, l)
    }

    /// Puts `lr` in the first empty list register (lowest set bit of
    /// ICH_ELRSR_EL2) and returns its index; None when every LR is in use,
    /// and the hypervisor must keep the interrupt in its own overflow list
    /// (and typically set UIE to learn when LRs free up).
    pub fn inject(&mut self, lr: ListRegister) -> Option<usize> {
        let n = (0..self.lrs.len()).find(|n| self.elrsr() & (1 << n) != 0)?;
        self.set_lr(n, lr).ok()?;
        Some(n)
    }

    /// ICH_HCR_EL2 as read.
    pub fn hcr(&self) -> IchHcr {
        self.hcr
    }

    /// ICH_HCR_EL2 write.
    pub fn write_hcr(&mut self, v: u64) -> Result<(), GicError> {
        self.hcr = IchHcr::decode(v)?;
        Ok(())
    }

    /// Replaces ICH_HCR_EL2 with an already decoded value.
    pub fn set_hcr(&mut self, h: IchHcr) {
        self.hcr = h;
    }

    /// ICH_VMCR_EL2 as read.
    pub fn read_vmcr(&self) -> u64 {
        let p = &self.prio;
        let f = |on: bool, m: u64| if on { m } else { 0 };
        f(p.group_enabled(Group::G0), vmcr::VENG0)
            | f(p.group_enabled(Group::G1), vmcr::VENG1)
            | f(self.vackctl, vmcr::VACKCTL)
            | f(self.vfiqen, vmcr::VFIQEN)
            | f(p.cbpr(), vmcr::VCBPR)
            | f(p.eoi_mode(), vmcr::VEOIM)
            | (u64::from(p.bpr(Group::G1)) << vmcr::VBPR1_SHIFT)
            | (u64::from(p.bpr(Group::G0)) << vmcr::VBPR0_SHIFT)
            | (u64::from(p.pmr()) << vmcr::VPMR_SHIFT)
    }

    /// ICH_VMCR_EL2 write (binary points below their minimum are raised).
    pub fn write_vmcr(&mut self, v: u64) -> Result<(), GicError> {
        if v & !vmcr::VALID != 0 {
            return Err(GicError::Reserved {
                reg: "ICH_VMCR_EL2",
                value: v,
            });
        }
        let p = &mut self.prio;
        p.set_group_enabled(Group::G0, v & vmcr::VENG0 != 0);
        p.set_group_enabled(Group::G1, v & vmcr::VENG1 != 0);
        p.set_eoi_mode(v & vmcr::VEOIM != 0);
        p.set_cbpr(false);
        p.set_bpr(Group::G0, ((v >> vmcr::VBPR0_SHIFT) & 7) as u8);
        p.set_bpr(Group::G1, ((v >> vmcr::VBPR1_SHIFT) & 7) as u8);
        p.set_cbpr(v & vmcr::VCBPR != 0);
        p.set_pmr((v >> vmcr::VPMR_SHIFT) as u8);
        self.vackctl = v & vmcr::VACKCTL != 0;
        self.vfiqen = v & vmcr::VFIQEN != 0;
        Ok(())
    }

    /// ICH_ELRSR_EL2: LRs that are empty (invalid, and not awaiting EOI
    /// maintenance).
    pub fn elrsr(&self) -> u16 {
        self.lr_bits(|l| !l.valid() && !l.eoi_maintenance)
    }

    /// ICH_EISR_EL2: LRs that are invalid with the EOI bit set (the guest
    /// deactivated an interrupt that asked for EOI maintenance).
    pub fn eisr(&self) -> u16 {
        self.lr_bits(|l| !l.valid() && l.eoi_maintenance)
    }

    fn lr_bits(&self, f: impl Fn(&ListRegister) -> bool) -> u16 {
        self.lrs
            .iter()
            .enumerate()
            .filter(|(_, l)| f(l))
            .fold(0, |acc, (i, _)| acc | (1 << i))
    }

    /// ICH_MISR_EL2: the maintenance interrupt reasons present now.
    pub fn misr(&self) -> u32 {
        let h = &self.hcr;
        let valid = self.lrs.iter().filter(|l| l.valid()).count();
        let none_pending = !self.lrs.iter().any(|l| l.state == LrState::Pending);
        let g0 = self.prio.group_enabled(Group::G0);
        let g1 = self.prio.group_enabled(Group::G1);
        let f = |on: bool, m: u32| if on { m } else { 0 };
        f(self.eisr() != 0, misr::EOI)
            | f(h.uie && valid <= 1, misr::U)
            | f(h.lrenpie && h.eoicount != 0, misr::LRENP)
            | f(h.npie && none_pending, misr::NP)
            | f(h.vgrp0eie && g0, misr::VGRP0E)
            | f(h.vgrp0die && !g0, misr::VGRP0D)
            | f(h.vgrp1eie && g1, misr::VGRP1E)
            | f(h.vgrp1die && !g1, misr::VGRP1D)
    }

    /// The maintenance interrupt's level (PPI 25 on the core running the
    /// vCPU): ICH_HCR_EL2.En and some reason in ICH_MISR_EL2.
    pub fn maintenance_line(&self) -> bool {
        self.hcr.en && self.misr() != 0
    }

    /// The INTID of the physical PPI the maintenance interrupt drives.
    pub fn maintenance_intid(&self) -> u32 {
        crate::hw::arm::intid::MAINTENANCE_PPI
    }

    fn best(&self, direct: Option<&DirectVlpis<'_>>) -> Option<(Candidate, Source)> {
        if !self.hcr.en {
            return None;
        }
        let mut best: Option<(Candidate, Source)> = None;
        let mut consider = |c: Candidate, s: Source| {
            if self.prio.group_enabled(c.group) && best.is_none_or(|(b, _)| c.beats(&b)) {
                best = Some((c, s));
            }
        };
        for (i, l) in self.lrs.iter().enumerate() {
            if l.state == LrState::Pending {
                let c = Candidate {
                    intid: l.vintid,
                    priority: l.priority & self.prio.mask(),
                    group: l.group,
                };
                consider(c, Source::Lr(i));
            }
        }
        if let Some(c) = direct.and_then(|d| d.best()) {
            consider(c, Source::Direct);
        }
        best
    }

    /// The highest-priority pending virtual interrupt (ICV_HPPIR1_EL1),
    /// list registers and directly injected ones together.
    pub fn highest_pending(&self, direct: Option<&DirectVlpis<'_>>) -> Option<Candidate> {
        self.best(direct).map(|(c, _)| c)
    }

    /// Whether the virtual IRQ (group 1) is asserted to the vCPU: the
    /// interface is enabled and the best pending interrupt passes the
    /// virtual PMR and running priority.
    pub fn virq_line(&self, direct: Option<&DirectVlpis<'_>>) -> bool {
        self.best(direct)
            .is_some_and(|(c, _)| c.group == Group::G1 && self.prio.signals(&c))
    }

    /// ICV_RPR_EL1.
    pub fn running_priority(&self) -> u8 {
        self.prio.running()
    }

    /// ICV_PMR_EL1 write by the guest.
    pub fn write_pmr(&mut self, v: u8) {
        self.prio.set_pmr(v);
    }

    /// `ICV_BPR<n>_EL1` write by the guest.
    pub fn write_bpr(&mut self, group: Group, v: u8) {
        self.prio.set_bpr(group, v);
    }

    /// ICV_CTLR_EL1.EOImode write by the guest (aliases VMCR.VEOIM).
    pub fn write_eoi_mode(&mut self, split: bool) {
        self.prio.set_eoi_mode(split);
    }

    /// `ICV_IGRPEN<n>_EL1` write by the guest (aliases VMCR.`VENG<n>`).
    pub fn write_igrpen(&mut self, group: Group, on: bool) {
        self.prio.set_group_enabled(group, on);
    }

    /// `ICV_IAR<group>_EL1` read by the guest: acknowledges the best pending
    /// virtual interrupt of `group` (an LR goes pending -> active; a direct
    /// vLPI leaves the pending table) and returns its vINTID, or 1023.
    pub fn acknowledge(&mut self, group: Group, direct: Option<&mut DirectVlpis<'_>>) -> u32 {
        let best = self
            .best(direct.as_deref())
            .filter(|(c, _)| c.group == group && self.prio.signals(c));
        let Some((c, src)) = best else {
            self.counters.spurious += 1;
            return SPURIOUS;
        };
        match src {
            Source::Lr(i) => {
                self.lrs[i].state = LrState::Active;
                self.counters.lr_acks += 1;
            }
            Source::Direct => {
                if let Some(d) = direct {
                    d.acknowledge(c.intid);
                }
                self.counters.direct_acks += 1;
            }
        }
        self.prio.activate(&c);
        c.intid
    }

    /// ICV_IAR1_EL1 read by the guest.
    pub fn read_iar1(&mut self, direct: Option<&mut DirectVlpis<'_>>) -> u32 {
        self.acknowledge(Group::G1, direct)
    }

    fn active_lr(&self, vintid: u32) -> Option<usize> {
        self.lrs.iter().position(|l| {
            l.vintid == vintid && matches!(l.state, LrState::Active | LrState::PendingActive)
        })
    }

    /// Deactivates `vintid` as an EOImode-0 EOIR or a DIR does: its active
    /// LR, else EOIcount. A directly injected vSGI has no active state and
    /// no LR; with ICH_HCR_EL2.vSGIEOICount set its EOI does not count
    /// (KVM sets the bit while no SGI of the vCPU is in its ap_list,
    /// vgic_v3_configure_hcr).
    fn deactivate_virtual(&mut self, vintid: u32, out: &mut VirtualEoi) {
        if let Some(i) = self.active_lr(vintid) {
            let l = &mut self.lrs[i];
            l.state = match l.state {
                LrState::PendingActive => LrState::Pending,
                _ => LrState::Invalid,
            };
            out.deactivated_lr = Some(i);
            out.hw_deactivate = l.hw;
            self.counters.deactivations += 1;
            self.counters.hw_deactivations += u64::from(l.hw.is_some());
            return;
        }
        if vintid >= LPI_BASE {
            // A directly injected vLPI: nothing is active.
            return;
        }
        if vintid < PPI_BASE && self.hcr.vsgi_eoicount {
            return;
        }
        self.counters.lr_not_present += 1;
        self.hcr.eoicount = (self.hcr.eoicount + 1).min(0x1F);
        out.eoicount_incremented = true;
    }

    /// `ICV_EOIR<n>_EL1` write by the guest: drops the virtual running
    /// priority; with VEOIM = 0 (or for an LPI in a list register) also
    /// deactivates. A HW = 1 list register reports its pINTID for physical
    /// deactivation ([`Self::guest_eoir`] performs it). Special INTIDs are
    /// ignored. `_direct` is the resident vPE's interrupts: none of them
    /// has an active state, so an EOI leaves them alone.
    pub fn write_eoir(
        &mut self,
        vintid: u32,
        _direct: Option<&mut DirectVlpis<'_>>,
    ) -> Result<VirtualEoi, GicError> {
        let mut out = VirtualEoi::default();
        match class(vintid) {
            IntidClass::Special => return Ok(out),
            IntidClass::Reserved => return Err(GicError::Intid(vintid)),
            _ => {}
        }
        self.counters.eois += 1;
        out.dropped = self.prio.drop_priority().map(|(p, _)| p);
        if !self.prio.eoi_mode() || vintid >= LPI_BASE {
            self.deactivate_virtual(vintid, &mut out);
        }
        Ok(out)
    }

    /// ICV_DIR_EL1 write by the guest: deactivation under VEOIM = 1 (with
    /// VEOIM = 0 the write is ignored; LPIs have nothing to deactivate).
    pub fn write_dir(
        &mut self,
        vintid: u32,
        _direct: Option<&mut DirectVlpis<'_>>,
    ) -> Result<VirtualEoi, GicError> {
        let mut out = VirtualEoi::default();
        match class(vintid) {
            IntidClass::Special | IntidClass::Lpi => return Ok(out),
            IntidClass::Reserved => return Err(GicError::Intid(vintid)),
            _ => {}
        }
        if self.prio.eoi_mode() {
            self.deactivate_virtual(vintid, &mut out);
        }
        Ok(out)
    }

    /// A guest EOIR write carried through to the physical GIC of the core
    /// the vCPU runs on: with HW = 1 the physical INTID is deactivated in
    /// `dist` (an SPI) or `redist` (a PPI), no exit involved.
    pub fn guest_eoir(
        &mut self,
        vintid: u32,
        direct: Option<&mut DirectVlpis<'_>>,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> Result<VirtualEoi, GicError> {
        let out = self.write_eoir(vintid, direct)?;
        if let Some(p) = out.hw_deactivate {
            deactivate(p, dist, redist)?;
        }
        Ok(out)
    }

    /// The same for ICV_DIR_EL1.
    pub fn guest_dir(
        &mut self,
        vintid: u32,
        direct: Option<&mut DirectVlpis<'_>>,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> Result<VirtualEoi, GicError> {
        let out = self.write_dir(vintid, direct)?;
        if let Some(p) = out.hw_deactivate {
            deactivate(p, dist, redist)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::arm::cpu_interface::CpuInterface;
    use crate::hw::arm::distributor::Route;
    use crate::hw::arm::intid::VTIMER_PPI;
    use crate::hw::arm::redistributor::{LpiConfigTable, VlpiTables};

    fn params() -> GicParams {
        GicParams::gicv4(2, 4)
    }

    fn vif() -> VcpuInterface {
        VcpuInterface::new(&params()).kvm_linux_guest()
    }

    #[test]
    fn lr_encoding_round_trips_and_rejects_reserved() {
        let l = ListRegister::hardware(27, 27, 0xA0);
        let v = l.encode();
        assert_eq!(v & lr::HW, lr::HW);
        assert_eq!((v >> lr::PINTID_SHIFT) & lr::PINTID_MASK, 27);
        assert_eq!(v >> lr::STATE_SHIFT, 1);
        assert_eq!(ListRegister::decode(v), Ok(l));
        let mut e = ListRegister::pending(40, 0x80);
        e.eoi_maintenance = true;
        assert_eq!(ListRegister::decode(e.encode()), Ok(e));
        // pending+active with HW; pINTID an SGI; vINTID special; RES0.
        assert!(ListRegister::decode(v | (3 << lr::STATE_SHIFT)).is_err());
        let sgi = ListRegister::hardware(1, 3, 0).encode();
        assert!(ListRegister::decode(sgi).is_err());
        assert!(ListRegister::decode(ListRegister::pending(1022, 0).encode()).is_err());
        assert!(ListRegister::decode(v | (1 << 56)).is_err());
        assert!(ListRegister::decode(ListRegister::pending(40, 0).encode() | (1 << 33)).is_err());
    }

    #[test]
    fn hcr_and_vmcr_round_trip() {
        let mut v = vif();
        let h = hcr::EN | hcr::UIE | hcr::TC | (5 << hcr::EOICOUNT_SHIFT);
        v.write_hcr(h).unwrap();
        assert_eq!(v.hcr().encode(), h);
        assert!(v.hcr().uie && v.hcr().eoicount == 5);
        assert!(v.write_hcr(1 << 9).is_err());
        let m = vmcr::VENG1
            | vmcr::VEOIM
            | (0xE8 << vmcr::VPMR_SHIFT)
            | (4 << vmcr::VBPR1_SHIFT)
            | (2 << vmcr::VBPR0_SHIFT);
        v.write_vmcr(m).unwrap();
        assert_eq!(v.read_vmcr(), m);
        assert!(v.priority().eoi_mode());
        // Binary points below the minimum are raised to it.
        v.write_vmcr(vmcr::VENG1).unwrap();
        assert_eq!((v.read_vmcr() >> vmcr::VBPR0_SHIFT) & 7, 2);
        assert_eq!((v.read_vmcr() >> vmcr::VBPR1_SHIFT) & 7, 3);
        assert_eq!(v.vtr() & 0x1F, 3, "four list registers");
        assert_eq!(v.vtr() & (1 << 20), 0, "GICv4: direct injection supported");
    }

    #[test]
    fn guest_acks_best_lr_and_eoi_deactivates_it() {
        let mut v = vif();
        v.set_lr(0, ListRegister::pending(40, 0x80)).unwrap();
        v.set_lr(1, ListRegister::pending(41, 0x40)).unwrap();
        assert!(v.virq_line(None));
        assert_eq!(v.read_iar1(None), 41);
        assert_eq!(v.lr(1).unwrap().state, LrState::Active);
        assert_eq!(v.running_priority(), 0x40);
        assert_eq!(v.read_iar1(None), SPURIOUS, "0x80 cannot preempt 0x40");
        let e = v.write_eoir(41, None).unwrap();
        assert_eq!(e.dropped, Some(0x40));
        assert_eq!(e.deactivated_lr, Some(1));
        assert_eq!(e.hw_deactivate, None);
        assert_eq!(v.elrsr(), 0b1110);
        assert_eq!(v.read_iar1(None), 40);
        // A disabled interface signals nothing.
        v.set_lr(2, ListRegister::pending(42, 0x10)).unwrap();
        v.write_hcr(0).unwrap();
        assert!(!v.virq_line(None));
        assert_eq!(v.read_iar1(None), SPURIOUS);
    }

    #[test]
    fn vpmr_masks_and_eoimode_split() {
        let mut v = vif();
        v.write_pmr(0x80);
        v.set_lr(0, ListRegister::pending(50, 0x80)).unwrap();
        assert_eq!(v.read_iar1(None), SPURIOUS);
        v.write_pmr(0xF0);
        v.write_eoi_mode(true);
        assert_eq!(v.read_iar1(None), 50);
        let e = v.write_eoir(50, None).unwrap();
        assert_eq!((e.dropped, e.deactivated_lr), (Some(0x80), None));
        assert_eq!(
            v.lr(0).unwrap().state,
            LrState::Active,
            "VEOIM: only a drop"
        );
        let d = v.write_dir(50, None).unwrap();
        assert_eq!(d.deactivated_lr, Some(0));
        assert!(!v.lr(0).unwrap().valid());
    }

    /// The DID-on-ARM timer path (did-arm.md §2.4): the physical vtimer PPI
    /// is acknowledged by the host (EOImode 1: priority drop only, it stays
    /// active), KVM writes an LR with HW = 1, and the guest's EOI
    /// deactivates the physical PPI with no exit.
    #[test]
    fn hw_lr_guest_eoi_deactivates_the_physical_intid() {
        let p = params();
        let mut dist = Distributor::new(&p);
        dist.set_group_enabled(Group::G1, true);
        let mut redist = Redistributor::new(0, &p);
        let mut cpu = CpuInterface::new(0, &p).linux_host(true);
        redist.configure(VTIMER_PPI, 0xA0, Group::G1).unwrap();
        redist.set_ppi_line(VTIMER_PPI, true).unwrap();
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), VTIMER_PPI);
        cpu.write_eoir1(VTIMER_PPI, &mut dist, &mut redist).unwrap();
        assert!(
            redist.bank().is_active(VTIMER_PPI),
            "host: priority drop only"
        );
        assert_eq!(cpu.running_priority(), 0xFF);
        // Active masks the still-high line: no storm at the host.
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), SPURIOUS);

        let mut v = vif();
        assert_eq!(
            v.inject(ListRegister::hardware(27, VTIMER_PPI, 0xA0)),
            Some(0)
        );
        assert_eq!(v.read_iar1(None), 27);
        // The guest reprograms its timer (line drops), then EOIs.
        redist.set_ppi_line(VTIMER_PPI, false).unwrap();
        let e = v.guest_eoir(27, None, &mut dist, &mut redist).unwrap();
        assert_eq!(e.hw_deactivate, Some(VTIMER_PPI));
        assert!(
            !redist.bank().is_active(VTIMER_PPI),
            "physical PPI deactivated"
        );
        assert_eq!(v.counters().hw_deactivations, 1);

        // An SPI forwarded the same way is deactivated in the distributor.
        let r = Route::Affinity(p.topology.affinity(0));
        dist.configure(48, 0x80, Group::G1, false, r).unwrap();
        dist.set_spi_line(48, true).unwrap();
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), 48);
        cpu.write_eoir1(48, &mut dist, &mut redist).unwrap();
        v.inject(ListRegister::hardware(48, 48, 0x80)).unwrap();
        assert_eq!(v.read_iar1(None), 48);
        dist.set_spi_line(48, false).unwrap();
        v.guest_eoir(48, None, &mut dist, &mut redist).unwrap();
        assert!(!dist.bank().is_active(48));
    }

    #[test]
    fn maintenance_on_underflow_no_pending_and_eoi() {
        let mut v = vif();
        v.write_hcr(hcr::EN | hcr::UIE).unwrap();
        v.set_lr(0, ListRegister::pending(40, 0x80)).unwrap();
        v.set_lr(1, ListRegister::pending(41, 0x90)).unwrap();
        assert!(!v.maintenance_line(), "two valid LRs: no underflow");
        assert_eq!(v.read_iar1(None), 40);
        v.write_eoir(40, None).unwrap();
        assert_eq!(v.misr(), misr::U);
        assert!(v.maintenance_line(), "one valid LR left: underflow");
        assert_eq!(v.maintenance_intid(), 25);

        // NP: no LR pending.
        let mut v = vif();
        v.write_hcr(hcr::EN | hcr::NPIE).unwrap();
        v.set_lr(0, ListRegister::pending(40, 0x80)).unwrap();
        assert!(!v.maintenance_line());
        v.read_iar1(None);
        assert_eq!(v.misr(), misr::NP);

        // EOI maintenance for a level interrupt, and its clearing.
        let mut v = vif();
        let mut l = ListRegister::pending(60, 0x80);
        l.eoi_maintenance = true;
        v.set_lr(2, l).unwrap();
        assert_eq!(v.read_iar1(None), 60);
        v.write_eoir(60, None).unwrap();
        assert_eq!(v.eisr(), 0b100);
        assert_eq!(v.elrsr() & 0b100, 0, "not empty until handled");
        assert!(v.maintenance_line());
        v.set_lr(2, ListRegister::EMPTY).unwrap();
        assert!(!v.maintenance_line());

        // LRENP: an EOI that finds no LR (the interrupt was in KVM's
        // overflow list) counts in EOIcount.
        let mut v = vif();
        v.write_hcr(hcr::EN | hcr::LRENPIE).unwrap();
        let e = v.write_eoir(70, None).unwrap();
        assert!(e.eoicount_incremented);
        assert_eq!(v.hcr().eoicount, 1);
        assert_eq!(v.misr(), misr::LRENP);
        // LPIs never count.
        assert!(!v.write_eoir(8200, None).unwrap().eoicount_incremented);
    }

    #[test]
    fn direct_vlpis_compete_with_list_registers() {
        let p = params();
        let mut t = LpiConfigTable::new(p.redistributor.lpis);
        t.set(9000, 0x80, true).unwrap();
        let mut redist = Redistributor::new(0, &p);
        redist.set_lpis_enabled(true, &t);
        let mut vt = VlpiTables::for_params(&p);
        vt.set_config(2, 8300, 0x30, true).unwrap();
        redist.make_resident(2, &mut vt).unwrap();
        redist.post_vlpi(2, 8300, Some(9000), &mut vt).unwrap();
        let mut v = vif();
        v.set_lr(0, ListRegister::pending(40, 0x50)).unwrap();
        let mut d = redist.direct_vlpis(&mut vt).unwrap();
        assert!(v.virq_line(Some(&d)));
        assert_eq!(v.read_iar1(Some(&mut d)), 8300, "0x30 beats the LR's 0x50");
        assert_eq!(d.best(), None, "acknowledged vLPI left the pending table");
        let e = v.write_eoir(8300, Some(&mut d)).unwrap();
        assert_eq!(e.dropped, Some(0x30));
        assert!(!e.eoicount_incremented && e.deactivated_lr.is_none());
        assert_eq!(v.read_iar1(Some(&mut d)), 40);
        assert_eq!(v.counters().direct_acks, 1);
        assert!(!redist.lpi_pending(9000), "resident: no doorbell was rung");
    }

    #[test]
    fn lpis_in_list_registers_deactivate_at_eoi_even_in_eoimode_1() {
        let mut v = vif();
        v.write_eoi_mode(true);
        v.set_lr(0, ListRegister::pending(8200, 0x80)).unwrap();
        assert_eq!(v.read_iar1(None), 8200);
        let e = v.write_eoir(8200, None).unwrap();
        assert_eq!(e.deactivated_lr, Some(0));
    }

    #[test]
    fn out_of_range_accesses_are_errors() {
        let mut v = vif();
        assert_eq!(v.lr(4), Err(GicError::ListRegister(4)));
        assert_eq!(
            v.set_lr(9, ListRegister::EMPTY),
            Err(GicError::ListRegister(9))
        );
        assert_eq!(v.write_eoir(2000, None), Err(GicError::Intid(2000)));
        assert_eq!(v.write_eoir(1023, None), Ok(VirtualEoi::default()));
        for i in 0..4 {
            assert_eq!(
                v.inject(ListRegister::pending(40 + i, 0x80)),
                Some(i as usize)
            );
        }
        assert_eq!(
            v.inject(ListRegister::pending(50, 0x80)),
            None,
            "all LRs in use"
        );
    }

    proptest::proptest! {
        /// Every ICH_LR value the model accepts encodes back to itself (no
        /// field overlaps or drops bits), and every value it refuses has a
        /// reason: RES0 bits, a special/unimplemented vINTID, an HW link to
        /// a non-PPI/SPI or in pending+active, or stray pINTID bits.
        #[test]
        fn lr_decode_encode_round_trip(
            raw in proptest::prelude::any::<u64>(),
            vintid in proptest::prop_oneof![0u64..1020, 8192u64..20000, 0u64..1 << 32],
            res0 in proptest::prelude::any::<bool>(),
            clean_link in proptest::prelude::any::<bool>(),
        ) {
            // Mostly well-formed values, so that both branches are exercised.
            let mut v = (raw & !lr::VINTID & if res0 { !0 } else { !lr::RES0 }) | vintid;
            if clean_link {
                let pmask = lr::PINTID_MASK << lr::PINTID_SHIFT;
                v = if v & lr::HW != 0 {
                    let p = 16 + ((v & pmask) >> lr::PINTID_SHIFT) % 1004;
                    (v & !pmask) | (p << lr::PINTID_SHIFT)
                } else {
                    v & !(pmask & !lr::EOI)
                };
            }
            match ListRegister::decode(v) {
                Ok(l) => proptest::prop_assert_eq!(l.encode(), v),
                Err(_) => {
                    let vintid = (v & lr::VINTID) as u32;
                    let p = ((v >> lr::PINTID_SHIFT) & lr::PINTID_MASK) as u32;
                    let hw = v & lr::HW != 0;
                    let reason = v & lr::RES0 != 0
                        || matches!(class(vintid), IntidClass::Special | IntidClass::Reserved)
                        || (hw && (!(16..1020).contains(&p) || v >> lr::STATE_SHIFT == 3))
                        || (!hw && v & ((lr::PINTID_MASK << lr::PINTID_SHIFT) & !lr::EOI) != 0);
                    proptest::prop_assert!(reason);
                }
            }
        }
    }
}
