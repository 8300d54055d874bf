//! The physical GICv3 CPU interface of one core: the ICC_*_EL1 system
//! registers (GICv3 spec §2.1, §4.1 "Interrupt handling state machine",
//! §4.8 priorities, §12.2 register descriptions; did-arm.md §2.3).
//!
//! Reading ICC_IAR1_EL1 acknowledges the highest-priority pending group-1
//! interrupt the distributor and this core's redistributor offer, provided
//! it is above the priority mask (ICC_PMR_EL1) and its group priority is
//! above the running priority: it becomes active (an LPI simply stops being
//! pending), its group priority is pushed onto the active priorities, and
//! its INTID is returned; otherwise 1023 (spurious). ICC_EOIR1_EL1 drops the
//! running priority and, with ICC_CTLR_EL1.EOImode = 0, also deactivates the
//! INTID written; with EOImode = 1 deactivation is a separate ICC_DIR_EL1
//! write (the split KVM uses for interrupts forwarded to a guest through a
//! hardware list register, did-arm.md §7.7). ICC_SGI1R_EL1 writes generate
//! SGIs; [`decode_sgi1r`] turns one into the set of target cores.

use crate::hw::arm::distributor::Distributor;
use crate::hw::arm::intid::{class, CoreSet, GicError, IntidClass, SPURIOUS};
use crate::hw::arm::params::{Affinity, GicParams, Topology};
use crate::hw::arm::priority::{pick, Candidate, Group, PriorityControl};
use crate::hw::arm::redistributor::Redistributor;

/// The ICC_* (and, in guest mode, ICV_*) system registers a guest or host
/// reaches with MRS/MSR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IccReg {
    /// ICC_IAR0_EL1: acknowledge a group-0 interrupt.
    Iar0,
    /// ICC_IAR1_EL1: acknowledge a group-1 interrupt.
    Iar1,
    /// ICC_EOIR0_EL1.
    Eoir0,
    /// ICC_EOIR1_EL1.
    Eoir1,
    /// ICC_DIR_EL1: deactivate.
    Dir,
    /// ICC_HPPIR0_EL1.
    Hppir0,
    /// ICC_HPPIR1_EL1.
    Hppir1,
    /// ICC_RPR_EL1: running priority.
    Rpr,
    /// ICC_PMR_EL1: priority mask.
    Pmr,
    /// ICC_BPR0_EL1.
    Bpr0,
    /// ICC_BPR1_EL1.
    Bpr1,
    /// ICC_CTLR_EL1.
    Ctlr,
    /// ICC_IGRPEN0_EL1.
    Igrpen0,
    /// ICC_IGRPEN1_EL1.
    Igrpen1,
    /// ICC_SGI0R_EL1: generate group-0 SGIs.
    Sgi0r,
    /// ICC_SGI1R_EL1: generate group-1 SGIs.
    Sgi1r,
    /// ICC_ASGI1R_EL1: generate SGIs for the other security state.
    Asgi1r,
    /// `ICC_AP0R<n>_EL1`.
    Ap0r(u8),
    /// `ICC_AP1R<n>_EL1`.
    Ap1r(u8),
}

/// Which trap controls govern an ICC register (ICH_HCR_EL2.TALL0/TALL1/TC,
/// HCR_EL2.IMO/FMO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegScope {
    /// A group-0 register (TALL0, FMO).
    Group0,
    /// A group-1 register (TALL1, IMO).
    Group1,
    /// Common to both groups (TC; DIR also TDIR).
    Common,
    /// An SGI generation register (trapped to EL2 by IMO/FMO and TC).
    SgiGeneration,
}

impl IccReg {
    /// The trap controls that apply to it.
    pub fn scope(&self) -> RegScope {
        match self {
            IccReg::Iar0 | IccReg::Eoir0 | IccReg::Hppir0 | IccReg::Bpr0 | IccReg::Igrpen0 => {
                RegScope::Group0
            }
            IccReg::Ap0r(_) => RegScope::Group0,
            IccReg::Iar1 | IccReg::Eoir1 | IccReg::Hppir1 | IccReg::Bpr1 | IccReg::Igrpen1 => {
                RegScope::Group1
            }
            IccReg::Ap1r(_) => RegScope::Group1,
            IccReg::Dir | IccReg::Rpr | IccReg::Pmr | IccReg::Ctlr => RegScope::Common,
            IccReg::Sgi0r | IccReg::Sgi1r | IccReg::Asgi1r => RegScope::SgiGeneration,
        }
    }
}

/// ICC_CTLR_EL1.CBPR.
pub const CTLR_CBPR: u64 = 1 << 0;
/// ICC_CTLR_EL1.EOImode.
pub const CTLR_EOIMODE: u64 = 1 << 1;
/// ICC_CTLR_EL1.PMHE (priority-mask hint; stored, no effect in the model).
pub const CTLR_PMHE: u64 = 1 << 6;
/// ICC_CTLR_EL1.PRIbits shift (read-only).
pub const CTLR_PRIBITS_SHIFT: u32 = 8;
/// ICC_CTLR_EL1.IDbits shift (read-only; 1 = 24-bit INTIDs).
pub const CTLR_IDBITS_SHIFT: u32 = 11;

/// ICC_SGI1R_EL1.TargetList, bits \[15:0\].
pub const SGIR_TARGET_LIST: u64 = 0xFFFF;
/// ICC_SGI1R_EL1.Aff1 shift.
pub const SGIR_AFF1_SHIFT: u32 = 16;
/// ICC_SGI1R_EL1.INTID shift (4 bits).
pub const SGIR_INTID_SHIFT: u32 = 24;
/// ICC_SGI1R_EL1.Aff2 shift.
pub const SGIR_AFF2_SHIFT: u32 = 32;
/// ICC_SGI1R_EL1.IRM: 1 = every PE but the sender.
pub const SGIR_IRM: u64 = 1 << 40;
/// ICC_SGI1R_EL1.RS shift (range selector; RES0 without RSS).
pub const SGIR_RS_SHIFT: u32 = 44;
/// ICC_SGI1R_EL1.Aff3 shift.
pub const SGIR_AFF3_SHIFT: u32 = 48;
/// Bits an ICC_SGI1R_EL1 write may set (RS excluded: the model has no
/// range-selector support, ICC_CTLR_EL1.RSS = 0).
const SGIR_VALID: u64 = SGIR_TARGET_LIST
    | (0xFF << SGIR_AFF1_SHIFT)
    | (0xF << SGIR_INTID_SHIFT)
    | (0xFF << SGIR_AFF2_SHIFT)
    | SGIR_IRM
    | (0xFF << SGIR_AFF3_SHIFT);

/// The SGIs one ICC_SGI1R_EL1 write generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SgiRequest {
    /// The SGI, 0..=15.
    pub intid: u32,
    /// The cores it goes to.
    pub targets: CoreSet,
}

/// Decodes an ICC_SGI1R_EL1 value written on core `sender` (GICv3 spec
/// §12.2.23): IRM = 1 targets every core but the sender; IRM = 0 the PEs of
/// cluster Aff3.Aff2.Aff1 whose Aff0 bit is set in the target list (the
/// sender too, if listed; affinities with no core are ignored). A value
/// with reserved bits (or RS ≠ 0) is refused.
pub fn decode_sgi1r(
    value: u64,
    sender: usize,
    topology: &Topology,
) -> Result<SgiRequest, GicError> {
    if value & !SGIR_VALID != 0 {
        return Err(GicError::Reserved {
            reg: "ICC_SGI1R_EL1",
            value,
        });
    }
    let intid = ((value >> SGIR_INTID_SHIFT) & 0xF) as u32;
    let mut targets = CoreSet::EMPTY;
    if value & SGIR_IRM != 0 {
        (0..topology.cores)
            .filter(|c| *c != sender)
            .for_each(|c| targets.insert(c));
    } else {
        for aff0 in (0..16u8).filter(|b| value & (1 << b) != 0) {
            let a = Affinity {
                aff3: (value >> SGIR_AFF3_SHIFT) as u8,
                aff2: (value >> SGIR_AFF2_SHIFT) as u8,
                aff1: (value >> SGIR_AFF1_SHIFT) as u8,
                aff0,
            };
            if let Some(c) = topology.core_of(a) {
                targets.insert(c);
            }
        }
    }
    Ok(SgiRequest { intid, targets })
}

/// The ICC_SGI1R_EL1 value that sends SGI `intid` to the cores of
/// `targets` that share one cluster with `targets`' first core (one write
/// per cluster is how Linux does it), or to everyone else with `broadcast`.
pub fn encode_sgi1r(intid: u32, targets: &CoreSet, broadcast: bool, topology: &Topology) -> u64 {
    let i = u64::from(intid & 0xF) << SGIR_INTID_SHIFT;
    if broadcast {
        return SGIR_IRM | i;
    }
    let Some(first) = targets.iter().next() else {
        return i;
    };
    let cluster = topology.affinity(first);
    let list = targets
        .iter()
        .map(|c| topology.affinity(c))
        .filter(|a| a.cluster() == cluster.cluster())
        .fold(0u64, |acc, a| acc | (1 << a.aff0));
    list | i
        | (u64::from(cluster.aff1) << SGIR_AFF1_SHIFT)
        | (u64::from(cluster.aff2) << SGIR_AFF2_SHIFT)
        | (u64::from(cluster.aff3) << SGIR_AFF3_SHIFT)
}

/// Delivers an SGI request to its targets' redistributors; returns the cores
/// where it became pending (the others had it pending already: it merges).
pub fn deliver_sgi(req: &SgiRequest, redists: &mut [Redistributor]) -> CoreSet {
    let mut newly = CoreSet::EMPTY;
    for c in req.targets.iter() {
        if let Some(r) = redists.get_mut(c) {
            if r.raise_sgi(req.intid).unwrap_or(false) {
                newly.insert(c);
            }
        }
    }
    newly
}

/// Deactivates physical `intid` wherever its state lives: an SGI/PPI in the
/// core's redistributor, an SPI in the distributor; an LPI has no active
/// state. Returns whether it was active. The path ICC_DIR_EL1, an EOImode-0
/// EOI, and a guest's EOI through a hardware list register all share.
pub fn deactivate(
    intid: u32,
    dist: &mut Distributor,
    redist: &mut Redistributor,
) -> Result<bool, GicError> {
    match class(intid) {
        IntidClass::Sgi | IntidClass::Ppi | IntidClass::Lpi => redist.deactivate(intid),
        IntidClass::Spi => dist.deactivate(intid).map(|(was, _)| was),
        IntidClass::Special | IntidClass::Reserved => Err(GicError::Intid(intid)),
    }
}

/// What an EOIR write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EoiOutcome {
    /// The priority dropped; None if nothing was active (UNPREDICTABLE in
    /// the architecture; counted and otherwise ignored here).
    pub dropped: Option<u8>,
    /// Whether the INTID was deactivated too (EOImode 0 and it was active).
    pub deactivated: bool,
}

/// Event counts of one CPU interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuInterfaceCounters {
    /// Acknowledges that returned an INTID.
    pub acks: u64,
    /// Acknowledges that returned 1023.
    pub spurious: u64,
    /// EOIR writes.
    pub eois: u64,
    /// EOIR writes with no active priority to drop.
    pub eoi_without_active: u64,
    /// Deactivations performed (by EOIR in EOImode 0, or by DIR).
    pub deactivations: u64,
    /// DIR writes naming an INTID that was not active.
    pub dir_not_active: u64,
    /// ICC_SGI1R_EL1 writes that generated SGIs.
    pub sgis_sent: u64,
}

/// One core's physical CPU interface.
#[derive(Clone, Debug)]
pub struct CpuInterface {
    core: usize,
    topology: Topology,
    prio: PriorityControl,
    priority_bits: u8,
    pmhe: bool,
    counters: CpuInterfaceCounters,
}

impl CpuInterface {
    /// Core `core`'s CPU interface in reset state: groups disabled, PMR 0,
    /// EOImode 0, nothing active.
    pub fn new(core: usize, params: &GicParams) -> Self {
        let bits = params.cpu_interface.priority_bits.clamp(4, 8);
        CpuInterface {
            core,
            topology: params.topology,
            prio: PriorityControl::new(bits),
            priority_bits: bits,
            pmhe: false,
            counters: CpuInterfaceCounters::default(),
        }
    }

    /// The core.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Priority mask, binary points, EOImode, group enables, active
    /// priorities.
    pub fn priority(&self) -> &PriorityControl {
        &self.prio
    }

    /// Event counts so far.
    pub fn counters(&self) -> CpuInterfaceCounters {
        self.counters
    }

    /// What a Linux host's GICv3 driver leaves set up: group 1 enabled, PMR
    /// 0xF0, EOImode 1 when it runs KVM (EOImode 0 otherwise).
    pub fn linux_host(mut self, eoi_mode_split: bool) -> Self {
        self.prio.set_group_enabled(Group::G1, true);
        self.prio.set_pmr(0xF0);
        self.prio.set_eoi_mode(eoi_mode_split);
        self
    }

    /// ICC_PMR_EL1 write.
    pub fn write_pmr(&mut self, v: u8) {
        self.prio.set_pmr(v);
    }

    /// ICC_BPR0/1_EL1 write.
    pub fn write_bpr(&mut self, group: Group, v: u8) {
        self.prio.set_bpr(group, v);
    }

    /// ICC_IGRPEN0/1_EL1 write.
    pub fn write_igrpen(&mut self, group: Group, on: bool) {
        self.prio.set_group_enabled(group, on);
    }

    /// ICC_CTLR_EL1 as read: CBPR, EOImode, PMHE, PRIbits, IDbits (24).
    pub fn read_ctlr(&self) -> u64 {
        (if self.prio.cbpr() { CTLR_CBPR } else { 0 })
            | (if self.prio.eoi_mode() {
                CTLR_EOIMODE
            } else {
                0
            })
            | (if self.pmhe { CTLR_PMHE } else { 0 })
            | (u64::from(self.priority_bits - 1) << CTLR_PRIBITS_SHIFT)
            | (1 << CTLR_IDBITS_SHIFT)
    }

    /// ICC_CTLR_EL1 write: CBPR, EOImode and PMHE are writable; the
    /// read-only fields are ignored; other bits are refused.
    pub fn write_ctlr(&mut self, v: u64) -> Result<(), GicError> {
        let ro = (0x7 << CTLR_PRIBITS_SHIFT) | (0x7 << CTLR_IDBITS_SHIFT);
        if v & !(CTLR_CBPR | CTLR_EOIMODE | CTLR_PMHE | ro) != 0 {
            return Err(GicError::Reserved {
                reg: "ICC_CTLR_EL1",
                value: v,
            });
        }
        self.prio.set_cbpr(v & CTLR_CBPR != 0);
        self.prio.set_eoi_mode(v & CTLR_EOIMODE != 0);
        self.pmhe = v & CTLR_PMHE != 0;
        Ok(())
    }

    /// ICC_RPR_EL1: the running priority (0xFF idle).
    pub fn running_priority(&self) -> u8 {
        self.prio.running()
    }

    /// The highest-priority pending interrupt of a group this interface has
    /// enabled (`ICC_HPPIR<n>_EL1` before the group check).
    pub fn highest_pending(&self, dist: &Distributor, redist: &Redistributor) -> Option<Candidate> {
        [Group::G0, Group::G1]
            .into_iter()
            .filter(|g| self.prio.group_enabled(*g))
            .map(|g| {
                pick(
                    dist.candidate(self.core, Some(g)),
                    redist.candidate(Some(g)),
                )
            })
            .fold(None, pick)
    }

    /// Whether the interface asserts IRQ (group 1) now.
    pub fn irq_line(&self, dist: &Distributor, redist: &Redistributor) -> bool {
        self.line(Group::G1, dist, redist)
    }

    /// Whether the interface asserts FIQ (group 0) now.
    pub fn fiq_line(&self, dist: &Distributor, redist: &Redistributor) -> bool {
        self.line(Group::G0, dist, redist)
    }

    fn line(&self, group: Group, dist: &Distributor, redist: &Redistributor) -> bool {
        self.highest_pending(dist, redist)
            .is_some_and(|c| c.group == group && self.prio.signals(&c))
    }

    /// `ICC_IAR<group>_EL1` read: acknowledges and returns the INTID, or 1023.
    pub fn acknowledge(
        &mut self,
        group: Group,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> u32 {
        let best = self
            .highest_pending(dist, redist)
            .filter(|c| c.group == group && self.prio.signals(c));
        let Some(c) = best else {
            self.counters.spurious += 1;
            return SPURIOUS;
        };
        let owner = if class(c.intid) == IntidClass::Spi {
            dist.acknowledge(c.intid)
        } else {
            redist.acknowledge(c.intid)
        };
        if owner.is_err() {
            // The candidate came from that very block; cannot fail.
            self.counters.spurious += 1;
            return SPURIOUS;
        }
        self.prio.activate(&c);
        self.counters.acks += 1;
        c.intid
    }

    /// ICC_IAR1_EL1 read.
    pub fn read_iar1(&mut self, dist: &mut Distributor, redist: &mut Redistributor) -> u32 {
        self.acknowledge(Group::G1, dist, redist)
    }

    /// `ICC_EOIR<n>_EL1` write of `intid`: priority drop, and with EOImode 0
    /// deactivation. The special INTIDs 1020..=1023 are ignored.
    pub fn write_eoir(
        &mut self,
        intid: u32,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> Result<EoiOutcome, GicError> {
        match class(intid) {
            IntidClass::Special => {
                return Ok(EoiOutcome {
                    dropped: None,
                    deactivated: false,
                })
            }
            IntidClass::Reserved => return Err(GicError::Intid(intid)),
            _ => {}
        }
        self.counters.eois += 1;
        let dropped = self.prio.drop_priority().map(|(p, _)| p);
        if dropped.is_none() {
            self.counters.eoi_without_active += 1;
        }
        let deactivated = if self.prio.eoi_mode() {
            false
        } else {
            deactivate(intid, dist, redist)?
        };
        self.counters.deactivations += u64::from(deactivated);
        Ok(EoiOutcome {
            dropped,
            deactivated,
        })
    }

    /// ICC_EOIR1_EL1 write.
    pub fn write_eoir1(
        &mut self,
        intid: u32,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> Result<EoiOutcome, GicError> {
        self.write_eoir(intid, dist, redist)
    }

    /// ICC_DIR_EL1 write: deactivates `intid`. Returns whether it was
    /// active.
    pub fn write_dir(
        &mut self,
        intid: u32,
        dist: &mut Distributor,
        redist: &mut Redistributor,
    ) -> Result<bool, GicError> {
        if class(intid) == IntidClass::Special {
            return Ok(false);
        }
        let was = deactivate(intid, dist, redist)?;
        if was {
            self.counters.deactivations += 1;
        } else {
            self.counters.dir_not_active += 1;
        }
        Ok(was)
    }

    /// ICC_SGI1R_EL1 write: the SGIs to deliver (see [`deliver_sgi`]).
    pub fn write_sgi1r(&mut self, value: u64) -> Result<SgiRequest, GicError> {
        let req = decode_sgi1r(value, self.core, &self.topology)?;
        self.counters.sgis_sent += 1;
        Ok(req)
    }

    /// `ICC_AP1R<n>_EL1` as read.
    pub fn read_ap1r(&self, n: u32) -> u32 {
        self.prio.active_priorities().register(Group::G1, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A 4-core GIC with group 1 enabled everywhere, SGIs 0..15 configured
    /// with priority 0x10 × (intid % 8), PMR 0xF8, EOImode as asked.
    struct Gic {
        params: GicParams,
        dist: Distributor,
        redist: Vec<Redistributor>,
        cpu: Vec<CpuInterface>,
    }

    impl Gic {
        fn new(cores: usize, eoi_split: bool) -> Self {
            let params = GicParams::gicv3(cores);
            let mut dist = Distributor::new(&params);
            dist.set_group_enabled(Group::G1, true);
            let mut redist: Vec<_> = (0..cores).map(|c| Redistributor::new(c, &params)).collect();
            for r in &mut redist {
                for sgi in 0..16 {
                    r.configure(sgi, sgi_priority(sgi), Group::G1).unwrap();
                }
            }
            let cpu = (0..cores)
                .map(|c| {
                    let mut i = CpuInterface::new(c, &params).linux_host(eoi_split);
                    i.write_pmr(0xF8);
                    i
                })
                .collect();
            Gic {
                params,
                dist,
                redist,
                cpu,
            }
        }

        fn ack(&mut self, c: usize) -> u32 {
            self.cpu[c].read_iar1(&mut self.dist, &mut self.redist[c])
        }

        fn eoi(&mut self, c: usize, intid: u32) -> EoiOutcome {
            self.cpu[c]
                .write_eoir1(intid, &mut self.dist, &mut self.redist[c])
                .unwrap()
        }

        fn dir(&mut self, c: usize, intid: u32) -> bool {
            self.cpu[c]
                .write_dir(intid, &mut self.dist, &mut self.redist[c])
                .unwrap()
        }

        fn send(&mut self, from: usize, value: u64) -> CoreSet {
            let req = self.cpu[from].write_sgi1r(value).unwrap();
            deliver_sgi(&req, &mut self.redist);
            req.targets
        }
    }

    fn sgi_priority(sgi: u32) -> u8 {
        (0x10 * (sgi % 8)) as u8
    }

    /// kvm-unit-tests arm/gic.c `ipi`: an SGI to a target list reaches
    /// exactly the listed cores (the sender only if listed); IRM = 1
    /// reaches every core but the sender.
    #[test]
    fn ipi_reaches_exactly_its_targets() {
        let mut g = Gic::new(4, false);
        let topo = g.params.topology;
        let mut list = CoreSet::EMPTY;
        list.insert(0);
        list.insert(2);
        let v = encode_sgi1r(5, &list, false, &topo);
        assert_eq!(g.send(1, v), list);
        let got: Vec<u32> = (0..4).map(|c| g.ack(c)).collect();
        assert_eq!(got, vec![5, SPURIOUS, 5, SPURIOUS]);
        for c in [0, 2] {
            g.eoi(c, 5);
        }

        // IRM broadcast from core 3.
        let v = encode_sgi1r(7, &CoreSet::EMPTY, true, &topo);
        let t = g.send(3, v);
        assert!(!t.contains(3) && t.len() == 3);
        let got: Vec<u32> = (0..4).map(|c| g.ack(c)).collect();
        assert_eq!(got, vec![7, 7, 7, SPURIOUS]);
        for c in 0..3 {
            g.eoi(c, 7);
        }

        // A sender that lists itself gets its own SGI.
        let mut me = CoreSet::EMPTY;
        me.insert(2);
        g.send(2, encode_sgi1r(1, &me, false, &topo));
        assert_eq!(g.ack(2), 1);
    }

    #[test]
    fn sgi1r_decoding() {
        let topo = Topology {
            cores: 8,
            per_cluster: 4,
        };
        // Cluster Aff1 = 1, Aff0 bits 0 and 3: cores 4 and 7; bit 5 names
        // a PE that does not exist and is ignored.
        let v = (1 << SGIR_AFF1_SHIFT) | 0b10_1001 | (9 << SGIR_INTID_SHIFT);
        let r = decode_sgi1r(v, 0, &topo).unwrap();
        assert_eq!(r.intid, 9);
        assert_eq!(r.targets.iter().collect::<Vec<_>>(), vec![4, 7]);
        assert!(decode_sgi1r(1 << SGIR_RS_SHIFT, 0, &topo).is_err());
        assert!(decode_sgi1r(1 << 63, 0, &topo).is_err());
        let mut t = CoreSet::EMPTY;
        t.insert(5);
        t.insert(6);
        t.insert(1); // another cluster: not in this write
        let enc = encode_sgi1r(3, &t, false, &topo);
        let back = decode_sgi1r(enc, 0, &topo).unwrap();
        assert_eq!(back.targets.iter().collect::<Vec<_>>(), vec![1]);
        let mut same = CoreSet::EMPTY;
        same.insert(5);
        same.insert(6);
        let enc = encode_sgi1r(3, &same, false, &topo);
        assert_eq!(decode_sgi1r(enc, 0, &topo).unwrap().targets, same);
    }

    /// kvm-unit-tests arm/gic.c `active`: an acknowledged interrupt is
    /// active and not delivered again until deactivated, even when raised
    /// anew; under EOImode 1 the EOI only drops priority and DIR
    /// deactivates.
    #[test]
    fn active_until_deactivated_and_eoimode_split() {
        for split in [false, true] {
            let mut g = Gic::new(2, split);
            g.redist[1].raise_sgi(4).unwrap();
            assert_eq!(g.ack(1), 4);
            assert!(g.redist[1].bank().is_active(4));
            assert_eq!(g.cpu[1].running_priority(), sgi_priority(4));
            g.redist[1].raise_sgi(4).unwrap();
            assert_eq!(g.ack(1), SPURIOUS, "active and pending: not re-delivered");
            let e = g.eoi(1, 4);
            assert_eq!(e.dropped, Some(sgi_priority(4)));
            assert_eq!(g.cpu[1].running_priority(), 0xFF);
            if split {
                assert!(!e.deactivated);
                assert!(g.redist[1].bank().is_active(4), "EOImode 1: still active");
                assert_eq!(g.ack(1), SPURIOUS);
                assert!(g.dir(1, 4));
                assert!(!g.dir(1, 4));
                assert_eq!(g.cpu[1].counters().dir_not_active, 1);
            } else {
                assert!(e.deactivated);
            }
            assert!(!g.redist[1].bank().is_active(4));
            assert_eq!(g.ack(1), 4, "the second raise is taken now");
        }
    }

    #[test]
    fn preemption_needs_a_higher_group_priority() {
        let mut g = Gic::new(1, false);
        g.redist[0].raise_sgi(5).unwrap(); // 0x50
        assert_eq!(g.ack(0), 5);
        g.redist[0].raise_sgi(6).unwrap(); // 0x60: lower priority
        assert_eq!(g.ack(0), SPURIOUS);
        g.redist[0].raise_sgi(2).unwrap(); // 0x20: preempts
        assert!(g.cpu[0].irq_line(&g.dist, &g.redist[0]));
        assert_eq!(g.ack(0), 2);
        assert_eq!(g.cpu[0].running_priority(), 0x20);
        assert_eq!(
            g.cpu[0].read_ap1r(0),
            (1 << (0x20 >> 3)) | (1 << (0x50 >> 3))
        );
        assert_eq!(g.eoi(0, 2).dropped, Some(0x20));
        assert_eq!(g.cpu[0].running_priority(), 0x50);
        assert_eq!(g.eoi(0, 5).dropped, Some(0x50));
        assert_eq!(g.ack(0), 6);
        g.eoi(0, 6);
        // BPR1 = 7 leaves one group-priority bit: 0x40 and 0x00 share group
        // 0x00, so 0x00 cannot preempt 0x40.
        g.cpu[0].write_bpr(Group::G1, 7);
        g.redist[0].raise_sgi(4).unwrap();
        assert_eq!(g.ack(0), 4);
        assert_eq!(g.cpu[0].running_priority(), 0x00);
        g.redist[0].raise_sgi(0).unwrap();
        assert_eq!(g.ack(0), SPURIOUS);
    }

    #[test]
    fn pmr_masks_and_groups_gate() {
        let mut g = Gic::new(1, false);
        g.cpu[0].write_pmr(0x30);
        g.redist[0].raise_sgi(3).unwrap(); // 0x30: not above the mask
        assert!(!g.cpu[0].irq_line(&g.dist, &g.redist[0]));
        assert_eq!(g.ack(0), SPURIOUS);
        g.cpu[0].write_pmr(0x38);
        assert_eq!(g.ack(0), 3);
        g.eoi(0, 3);
        g.cpu[0].write_igrpen(Group::G1, false);
        g.redist[0].raise_sgi(3).unwrap();
        assert_eq!(g.ack(0), SPURIOUS);
        // A group-0 interrupt is FIQ and IAR1 does not take it.
        g.cpu[0].write_igrpen(Group::G1, true);
        g.cpu[0].write_igrpen(Group::G0, true);
        g.redist[0].configure(9, 0x00, Group::G0).unwrap();
        g.redist[0].raise_sgi(9).unwrap();
        assert!(g.cpu[0].fiq_line(&g.dist, &g.redist[0]));
        assert_eq!(g.ack(0), SPURIOUS);
        assert_eq!(
            g.cpu[0].acknowledge(Group::G0, &mut g.dist, &mut g.redist[0]),
            9
        );
    }

    #[test]
    fn spis_and_lpis_through_the_cpu_interface() {
        let mut g = Gic::new(2, true);
        let r = crate::hw::arm::distributor::Route::Affinity(g.params.topology.affinity(1));
        g.dist.configure(40, 0x80, Group::G1, false, r).unwrap();
        assert_eq!(g.dist.set_spi_line(40, true), Ok(Some(1)));
        assert_eq!(g.ack(0), SPURIOUS);
        assert_eq!(g.ack(1), 40);
        g.dist.set_spi_line(40, false).unwrap();
        assert!(!g.eoi(1, 40).deactivated);
        assert!(g.dist.bank().is_active(40));
        assert!(g.dir(1, 40));
        assert!(!g.dist.bank().is_active(40));
        // An LPI: acknowledged, then EOI drops priority; nothing to deactivate.
        let mut t = crate::hw::arm::redistributor::LpiConfigTable::new(8192);
        t.set(8195, 0x40, true).unwrap();
        g.redist[1].set_lpis_enabled(true, &t);
        g.redist[1].set_lpi_pending(8195).unwrap();
        assert_eq!(g.ack(1), 8195);
        assert_eq!(g.eoi(1, 8195).dropped, Some(0x40));
        assert!(!g.dir(1, 8195));
        // Errors, not panics, on bad INTIDs.
        assert!(g.cpu[1]
            .write_eoir1(5000, &mut g.dist, &mut g.redist[1])
            .is_err());
        assert_eq!(
            g.cpu[1].write_eoir1(1023, &mut g.dist, &mut g.redist[1]),
            Ok(EoiOutcome {
                dropped: None,
                deactivated: false
            })
        );
        assert!(g.cpu[1]
            .write_dir(300, &mut g.dist, &mut g.redist[1])
            .is_err());
    }

    #[test]
    fn ctlr_fields() {
        let mut c = CpuInterface::new(0, &GicParams::gicv3(1));
        assert_eq!((c.read_ctlr() >> CTLR_PRIBITS_SHIFT) & 7, 4);
        c.write_ctlr(CTLR_EOIMODE).unwrap();
        assert!(c.priority().eoi_mode());
        assert!(c.write_ctlr(1 << 20).is_err());
        assert_eq!(IccReg::Sgi1r.scope(), RegScope::SgiGeneration);
        assert_eq!(IccReg::Dir.scope(), RegScope::Common);
        assert_eq!(IccReg::Iar1.scope(), RegScope::Group1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// From core, SGI, target bitmask over 4 cores (0 = IRM broadcast).
        Send(usize, u32, u8),
        Ack(usize),
        /// EOI of the most recently acknowledged, not yet dropped, INTID.
        Eoi(usize),
        /// DIR of the k-th active INTID (EOImode 1 cores).
        Dir(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4usize, 0..16u32, 0..16u8).prop_map(|(c, i, t)| Op::Send(c, i, t)),
            (0..4usize).prop_map(Op::Ack),
            (0..4usize).prop_map(Op::Eoi),
            (0..4usize, 0..4usize).prop_map(|(c, k)| Op::Dir(c, k)),
        ]
    }

    proptest! {
        /// Random SGI/ack/EOI/DIR sequences: an INTID is never delivered
        /// again while active, only targets ever receive an SGI, and the
        /// running priority is the highest (numerically lowest) priority
        /// acknowledged and not yet dropped.
        #[test]
        fn sgi_ack_eoi_invariants(ops in proptest::collection::vec(op(), 1..120), split in any::<[bool; 4]>()) {
            let mut g = Gic::new(4, false);
            for (c, s) in split.iter().enumerate() {
                g.cpu[c].write_ctlr(if *s { CTLR_EOIMODE } else { 0 }).unwrap();
            }
            let topo = g.params.topology;
            // Model: per core, SGIs sent and not yet taken; the stack of
            // (INTID, priority) acknowledged and not dropped; active INTIDs.
            let mut sent = [[false; 16]; 4];
            let mut stack: [Vec<(u32, u8)>; 4] = Default::default();
            let mut active = [[false; 16]; 4];
            for op in ops {
                match op {
                    Op::Send(from, intid, mask) => {
                        let mut t = CoreSet::EMPTY;
                        (0..4).filter(|c| mask & (1 << c) != 0).for_each(|c| t.insert(c));
                        let v = encode_sgi1r(intid, &t, mask == 0, &topo);
                        let got = g.send(from, v);
                        for (c, s) in sent.iter_mut().enumerate() {
                            let want = if mask == 0 { c != from } else { t.contains(c) };
                            prop_assert_eq!(got.contains(c), want);
                            if want { s[intid as usize] = true; }
                        }
                    }
                    Op::Ack(c) => {
                        let running = g.cpu[c].running_priority();
                        let i = g.ack(c);
                        if i != SPURIOUS {
                            prop_assert!(sent[c][i as usize], "core {} got SGI {} nobody sent it", c, i);
                            prop_assert!(!active[c][i as usize], "SGI {} delivered twice while active", i);
                            prop_assert!(sgi_priority(i) < running);
                            sent[c][i as usize] = false;
                            active[c][i as usize] = true;
                            stack[c].push((i, sgi_priority(i)));
                        } else {
                            // Nothing deliverable: every sent SGI is active
                            // or cannot preempt.
                            for s in 0..16u32 {
                                if sent[c][s as usize] && !active[c][s as usize] {
                                    prop_assert!(sgi_priority(s) >= running);
                                }
                            }
                        }
                    }
                    Op::Eoi(c) => {
                        if let Some((i, p)) = stack[c].pop() {
                            let e = g.eoi(c, i);
                            prop_assert_eq!(e.dropped, Some(p));
                            prop_assert_eq!(e.deactivated, !split[c]);
                            if !split[c] { active[c][i as usize] = false; }
                        }
                    }
                    Op::Dir(c, k) => {
                        if split[c] {
                            // Only INTIDs already dropped: DIR before the
                            // priority drop is UNPREDICTABLE.
                            let dropped: Vec<u32> = (0..16u32)
                                .filter(|i| active[c][*i as usize] && !stack[c].iter().any(|(s, _)| s == i))
                                .collect();
                            if let Some(&i) = dropped.get(k % dropped.len().max(1)) {
                                prop_assert!(g.dir(c, i));
                                active[c][i as usize] = false;
                            }
                        }
                    }
                }
                for c in 0..4 {
                    let want = stack[c].iter().map(|(_, p)| *p).min().unwrap_or(0xFF);
                    prop_assert_eq!(g.cpu[c].running_priority(), want);
                    for i in 0..16u32 {
                        prop_assert_eq!(g.redist[c].bank().is_active(i), active[c][i as usize]);
                    }
                }
            }
        }
    }
}
