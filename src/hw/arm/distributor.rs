//! The GICv3 distributor (GICD): the SPIs, INTIDs 32..1019 (GICv3 spec
//! §2.1 "Distributor", §12.9 register map; did-arm.md §2.3 "SPI routing and
//! priority").
//!
//! Per SPI it keeps enable, pending, active, priority, group and trigger (in
//! the shared [`IrqBank`]) and the GICD_IROUTER routing: a target affinity,
//! or 1-of-N, where the distributor picks one participating core (here round
//! robin, an IMPLEMENTATION DEFINED choice). A device line going high makes
//! the SPI pending; if it is enabled and its group is enabled the distributor
//! forwards it to the target core's CPU interface, which is what
//! [`Distributor::set_spi_line`] reports. The model runs with affinity
//! routing on and a single security state (GICD_CTLR.ARE = DS = 1), as KVM
//! guests and Linux hosts on GICv3 do.

use crate::hw::arm::bank::IrqBank;
use crate::hw::arm::intid::{CoreSet, GicError, SPI_BASE, SPI_LIMIT};
use crate::hw::arm::params::{Affinity, GicParams, Topology};
use crate::hw::arm::priority::{Candidate, Group};

/// GICD register offsets beyond the shared per-INTID layout
/// ([`crate::hw::arm::bank::offsets`]).
pub mod regs {
    /// Control register.
    pub const CTLR: u64 = 0x0000;
    /// Type register (read-only).
    pub const TYPER: u64 = 0x0004;
    /// Implementer identification (read-only).
    pub const IIDR: u64 = 0x0008;
    /// Routing register of INTID n at `IROUTER + 8n` (64-bit, n = 32..1019).
    pub const IROUTER: u64 = 0x6000;
    /// Peripheral ID2 (ArchRev in bits \[7:4\]).
    pub const PIDR2: u64 = 0xFFE8;
}

/// GICD_CTLR.EnableGrp0.
pub const CTLR_ENABLE_GRP0: u32 = 1 << 0;
/// GICD_CTLR.EnableGrp1 (single security state).
pub const CTLR_ENABLE_GRP1: u32 = 1 << 1;
/// GICD_CTLR.ARE: affinity routing, always on here (RAO/WI).
pub const CTLR_ARE: u32 = 1 << 4;
/// GICD_CTLR.DS: single security state (RAO/WI).
pub const CTLR_DS: u32 = 1 << 6;
/// GICD_IROUTER.Interrupt_Routing_Mode: 1 = 1-of-N.
pub const IROUTER_IRM: u64 = 1 << 31;

/// Where an SPI goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The PE with this affinity (GICD_IROUTER.IRM = 0).
    Affinity(Affinity),
    /// Any one participating PE (IRM = 1).
    OneOfN,
}

impl Route {
    /// Decodes a GICD_IROUTER value; reserved bits are refused.
    pub fn decode(v: u64) -> Result<Route, GicError> {
        if v & !(0xFF_FFFF | IROUTER_IRM | (0xFF << 32)) != 0 {
            return Err(GicError::Reserved {
                reg: "GICD_IROUTER",
                value: v,
            });
        }
        if v & IROUTER_IRM != 0 {
            return Ok(Route::OneOfN);
        }
        Ok(Route::Affinity(Affinity {
            aff0: v as u8,
            aff1: (v >> 8) as u8,
            aff2: (v >> 16) as u8,
            aff3: (v >> 32) as u8,
        }))
    }

    /// The GICD_IROUTER value.
    pub fn encode(&self) -> u64 {
        match self {
            Route::OneOfN => IROUTER_IRM,
            Route::Affinity(a) => {
                u64::from(a.aff0)
                    | (u64::from(a.aff1) << 8)
                    | (u64::from(a.aff2) << 16)
                    | (u64::from(a.aff3) << 32)
            }
        }
    }
}

/// Event counts of the distributor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DistributorCounters {
    /// SPIs that became pending.
    pub pending: u64,
    /// SPIs forwarded to a CPU interface (pending, enabled, group enabled,
    /// routed).
    pub forwarded: u64,
    /// SPIs pending with a route that names no existing core (or 1-of-N
    /// with no participating core): they wait, undelivered.
    pub unroutable: u64,
    /// Acknowledges (pending -> active).
    pub acks: u64,
    /// Deactivations of an active SPI.
    pub deactivations: u64,
}

/// No core chosen yet for a 1-of-N SPI.
const NO_CORE: u16 = u16::MAX;

/// The distributor.
#[derive(Clone, Debug)]
pub struct Distributor {
    topology: Topology,
    bank: IrqBank,
    route: Box<[Route]>,
    /// The core a pending 1-of-N SPI was given to.
    chosen: Box<[u16]>,
    enable_grp: [bool; 2],
    participating: CoreSet,
    next_one_of_n: usize,
    arch_rev: u32,
    lpis: bool,
    id_bits: u32,
    counters: DistributorCounters,
}

impl Distributor {
    /// A distributor in reset state: groups disabled, every SPI disabled,
    /// level-sensitive, group 0, priority 0 and routed to core 0; every core
    /// participates in 1-of-N.
    pub fn new(params: &GicParams) -> Self {
        let spis = params.distributor.spis.min(SPI_LIMIT - SPI_BASE);
        let lpi_end = params.lpi_end();
        Distributor {
            topology: params.topology,
            bank: IrqBank::new(SPI_BASE, spis, params.cpu_interface.priority_bits, 0),
            route: vec![Route::Affinity(Affinity::default()); spis as usize].into_boxed_slice(),
            chosen: vec![NO_CORE; spis as usize].into_boxed_slice(),
            enable_grp: [false; 2],
            participating: CoreSet::first(params.topology.cores),
            next_one_of_n: 0,
            arch_rev: if params.gicv4 { 4 } else { 3 },
            lpis: params.redistributor.lpis > 0,
            id_bits: u32::BITS - (lpi_end.max(1024) - 1).leading_zeros(),
            counters: DistributorCounters::default(),
        }
    }

    /// The per-SPI state (enable, priority, group...).
    pub fn bank(&self) -> &IrqBank {
        &self.bank
    }

    /// The per-SPI state, to configure it directly (as MMIO writes would).
    pub fn bank_mut(&mut self) -> &mut IrqBank {
        &mut self.bank
    }

    /// Event counts so far.
    pub fn counters(&self) -> DistributorCounters {
        self.counters
    }

    /// Whether `group` is enabled (GICD_CTLR.EnableGrp0/1).
    pub fn group_enabled(&self, group: Group) -> bool {
        self.enable_grp[group.index()]
    }

    /// Enables or disables forwarding of `group`.
    pub fn set_group_enabled(&mut self, group: Group, on: bool) {
        self.enable_grp[group.index()] = on;
    }

    /// Configures SPI `intid` in one call: priority, group, trigger, route,
    /// enable (what a driver's request_irq amounts to).
    pub fn configure(
        &mut self,
        intid: u32,
        priority: u8,
        group: Group,
        edge: bool,
        route: Route,
    ) -> Result<(), GicError> {
        self.bank.set_priority(intid, priority)?;
        self.bank.set_group(intid, group)?;
        self.bank.set_edge(intid, edge)?;
        self.set_route(intid, route)?;
        self.bank.set_enabled(intid, true)
    }

    /// The route of SPI `intid`.
    pub fn route(&self, intid: u32) -> Result<Route, GicError> {
        let i = self.index(intid)?;
        Ok(self.route[i])
    }

    /// Sets the route of SPI `intid` (`GICD_IROUTER<n>`). A pending 1-of-N
    /// choice is dropped and made again.
    pub fn set_route(&mut self, intid: u32, route: Route) -> Result<(), GicError> {
        let i = self.index(intid)?;
        self.route[i] = route;
        self.chosen[i] = NO_CORE;
        self.resolve(intid);
        Ok(())
    }

    /// Whether `core` takes part in 1-of-N distribution (a sleeping PE, or
    /// one whose GICR_WAKER says so, does not).
    pub fn set_participating(&mut self, core: usize, on: bool) {
        if on {
            self.participating.insert(core);
        } else {
            self.participating.remove(core);
        }
    }

    fn index(&self, intid: u32) -> Result<usize, GicError> {
        if self.bank.contains(intid) {
            Ok((intid - SPI_BASE) as usize)
        } else {
            Err(GicError::Intid(intid))
        }
    }

    /// The core SPI `intid` is delivered to now: its affinity's core, or the
    /// core chosen for it under 1-of-N. None if there is none.
    pub fn target(&self, intid: u32) -> Option<usize> {
        let i = self.index(intid).ok()?;
        match self.route[i] {
            Route::Affinity(a) => self.topology.core_of(a),
            Route::OneOfN => (self.chosen[i] != NO_CORE).then_some(usize::from(self.chosen[i])),
        }
    }

    /// Gives a pending 1-of-N SPI without a core its core (round robin over
    /// the participating ones).
    fn resolve(&mut self, intid: u32) {
        let Ok(i) = self.index(intid) else { return };
        if self.route[i] != Route::OneOfN
            || self.chosen[i] != NO_CORE
            || !self.bank.is_pending(intid)
        {
            return;
        }
        let n = self.topology.cores;
        if let Some(c) = (0..n)
            .map(|k| (self.next_one_of_n + k) % n)
            .find(|c| self.participating.contains(*c))
        {
            self.chosen[i] = c as u16;
            self.next_one_of_n = (c + 1) % n;
        }
    }

    /// What becoming pending means for SPI `intid`: the core to signal if
    /// it is now forwarded.
    fn forwarded(&mut self, intid: u32, became_pending: bool) -> Option<usize> {
        if !became_pending {
            return None;
        }
        self.counters.pending += 1;
        self.resolve(intid);
        let Some(core) = self.target(intid) else {
            self.counters.unroutable += 1;
            return None;
        };
        let ready = self.bank.is_enabled(intid)
            && !self.bank.is_active(intid)
            && self.group_enabled(self.bank.group(intid));
        if ready {
            self.counters.forwarded += 1;
        }
        ready.then_some(core)
    }

    /// A device drives SPI `intid`'s line. Returns the core whose CPU
    /// interface now has it to consider, if it became pending and is
    /// forwarded.
    pub fn set_spi_line(&mut self, intid: u32, level: bool) -> Result<Option<usize>, GicError> {
        let became = self.bank.set_line(intid, level)?;
        Ok(self.forwarded(intid, became))
    }

    /// Makes SPI `intid` pending as a GICD_ISPENDR or GICD_SETSPI_NSR write
    /// (a message-based SPI) does.
    pub fn set_pending(&mut self, intid: u32) -> Result<Option<usize>, GicError> {
        let became = self.bank.set_pending(intid)?;
        Ok(self.forwarded(intid, became))
    }

    /// The best SPI of `group` (both groups if None) for `core`'s CPU
    /// interface: pending, enabled, not active, routed to `core`, its group
    /// enabled here.
    pub fn candidate(&self, core: usize, group: Option<Group>) -> Option<Candidate> {
        self.bank.best(group, |intid| {
            self.target(intid) == Some(core) && self.group_enabled(self.bank.group(intid))
        })
    }

    /// `core` acknowledges SPI `intid`: pending -> active.
    pub fn acknowledge(&mut self, intid: u32) -> Result<(), GicError> {
        self.bank.acknowledge(intid)?;
        self.counters.acks += 1;
        Ok(())
    }

    /// Deactivates SPI `intid` (ICC_DIR_EL1, EOImode 0 EOI, or a guest EOI
    /// through a hardware list register). Returns whether it was active and
    /// the core to signal if it is pending again (a level line still high);
    /// a 1-of-N SPI is given a core afresh.
    pub fn deactivate(&mut self, intid: u32) -> Result<(bool, Option<usize>), GicError> {
        let was = self.bank.set_active(intid, false)?;
        if was {
            self.counters.deactivations += 1;
        }
        let i = self.index(intid)?;
        if self.route[i] == Route::OneOfN {
            self.chosen[i] = NO_CORE;
            self.resolve(intid);
        }
        let again = self.bank.is_pending(intid) && self.bank.is_enabled(intid);
        Ok((was, again.then(|| self.target(intid)).flatten()))
    }

    /// GICD_CTLR as read.
    pub fn ctlr(&self) -> u32 {
        CTLR_ARE
            | CTLR_DS
            | if self.enable_grp[0] {
                CTLR_ENABLE_GRP0
            } else {
                0
            }
            | if self.enable_grp[1] {
                CTLR_ENABLE_GRP1
            } else {
                0
            }
    }

    /// GICD_TYPER: ITLinesNumber, LPIS, IDbits (the CPU number field is
    /// meaningless with affinity routing).
    pub fn typer(&self) -> u32 {
        let it_lines = (SPI_BASE + self.bank_len()).div_ceil(32) - 1;
        it_lines | (u32::from(self.lpis) << 17) | ((self.id_bits - 1) << 19)
    }

    fn bank_len(&self) -> u32 {
        self.route.len() as u32
    }

    /// A 32- or 64-bit MMIO read at `offset` from GICD_base.
    pub fn mmio_read(&self, offset: u64) -> Result<u64, GicError> {
        if let Some(v) = self.bank.mmio_read(offset) {
            return Ok(u64::from(v));
        }
        match offset {
            regs::CTLR => Ok(u64::from(self.ctlr())),
            regs::TYPER => Ok(u64::from(self.typer())),
            regs::IIDR => Ok(0x43B),
            regs::PIDR2 => Ok(u64::from(self.arch_rev << 4)),
            o if (regs::IROUTER..regs::IROUTER + 8 * 1020).contains(&o) && o % 8 == 0 => {
                let intid = ((o - regs::IROUTER) / 8) as u32;
                // Routers of unimplemented INTIDs (and 0..31) are RAZ.
                Ok(self.route(intid).map(|r| r.encode()).unwrap_or(0))
            }
            o => Err(GicError::Offset(o)),
        }
    }

    /// A 32- or 64-bit MMIO write at `offset` from GICD_base.
    pub fn mmio_write(&mut self, offset: u64, value: u64) -> Result<(), GicError> {
        if self.bank.mmio_write(offset, value as u32).is_some() {
            // An ISPENDR write may have made 1-of-N SPIs pending.
            for i in 0..self.bank_len() {
                self.resolve(SPI_BASE + i);
            }
            return Ok(());
        }
        match offset {
            regs::CTLR => {
                let allowed = CTLR_ENABLE_GRP0 | CTLR_ENABLE_GRP1 | CTLR_ARE | CTLR_DS;
                if value & !u64::from(allowed) != 0 {
                    return Err(GicError::Reserved {
                        reg: "GICD_CTLR",
                        value,
                    });
                }
                let v = value as u32;
                self.enable_grp = [v & CTLR_ENABLE_GRP0 != 0, v & CTLR_ENABLE_GRP1 != 0];
                Ok(())
            }
            regs::TYPER | regs::IIDR | regs::PIDR2 => Err(GicError::ReadOnly(offset)),
            o if (regs::IROUTER..regs::IROUTER + 8 * 1020).contains(&o) && o % 8 == 0 => {
                let intid = ((o - regs::IROUTER) / 8) as u32;
                let route = Route::decode(value)?;
                match self.set_route(intid, route) {
                    // Unimplemented INTIDs are WI.
                    Err(GicError::Intid(_)) => Ok(()),
                    r => r,
                }
            }
            o => Err(GicError::Offset(o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::arm::bank::offsets;

    fn dist() -> Distributor {
        let mut d = Distributor::new(&GicParams::gicv3(4));
        d.set_group_enabled(Group::G1, true);
        d
    }

    fn to_core(d: &Distributor, core: usize) -> Route {
        Route::Affinity(d.topology.affinity(core))
    }

    #[test]
    fn an_enabled_spi_is_forwarded_to_its_affinity() {
        let mut d = dist();
        let r = to_core(&d, 2);
        d.configure(40, 0xA0, Group::G1, false, r).unwrap();
        assert_eq!(d.set_spi_line(40, true), Ok(Some(2)));
        assert_eq!(d.candidate(2, Some(Group::G1)).map(|c| c.intid), Some(40));
        assert_eq!(d.candidate(1, Some(Group::G1)), None, "not routed there");
        d.acknowledge(40).unwrap();
        assert_eq!(
            d.candidate(2, Some(Group::G1)),
            None,
            "active, not offered again"
        );
        d.set_spi_line(40, false).unwrap();
        assert_eq!(d.deactivate(40), Ok((true, None)));
        assert_eq!(d.counters().deactivations, 1);
    }

    #[test]
    fn level_still_high_at_deactivate_is_signalled_again() {
        let mut d = dist();
        let r = to_core(&d, 1);
        d.configure(33, 0x80, Group::G1, false, r).unwrap();
        d.set_spi_line(33, true).unwrap();
        d.acknowledge(33).unwrap();
        assert_eq!(d.deactivate(33), Ok((true, Some(1))));
        assert!(d.candidate(1, None).is_some());
    }

    #[test]
    fn disabled_spi_or_group_is_not_forwarded() {
        let mut d = dist();
        let r = to_core(&d, 0);
        d.configure(50, 0x80, Group::G1, true, r).unwrap();
        d.bank_mut().set_enabled(50, false).unwrap();
        assert_eq!(d.set_spi_line(50, true), Ok(None));
        assert!(d.bank().is_pending(50), "pending is kept while disabled");
        d.bank_mut().set_enabled(50, true).unwrap();
        assert!(d.candidate(0, None).is_some());
        d.set_group_enabled(Group::G1, false);
        assert_eq!(d.candidate(0, None), None);
    }

    #[test]
    fn one_of_n_picks_participating_cores_in_turn() {
        let mut d = dist();
        d.set_participating(1, false);
        for spi in [60, 61, 62] {
            d.configure(spi, 0x80, Group::G1, true, Route::OneOfN)
                .unwrap();
        }
        let got: Vec<_> = [60, 61, 62]
            .iter()
            .map(|s| d.set_spi_line(*s, true).unwrap())
            .collect();
        assert_eq!(got, vec![Some(0), Some(2), Some(3)]);
        assert_eq!(d.candidate(2, None).map(|c| c.intid), Some(61));
    }

    #[test]
    fn unroutable_affinity_waits_and_is_counted() {
        let mut d = dist();
        let nowhere = Route::Affinity(Affinity {
            aff1: 9,
            ..Affinity::default()
        });
        d.configure(70, 0x80, Group::G1, true, nowhere).unwrap();
        assert_eq!(d.set_spi_line(70, true), Ok(None));
        assert_eq!(d.counters().unroutable, 1);
        // Rerouting to a real core makes it deliverable.
        let r = to_core(&d, 3);
        d.set_route(70, r).unwrap();
        assert_eq!(d.candidate(3, None).map(|c| c.intid), Some(70));
    }

    #[test]
    fn registers() {
        let mut d = Distributor::new(&GicParams::gicv3(4));
        // 256 SPIs: INTIDs up to 287 -> 9 blocks of 32 -> ITLinesNumber 8.
        assert_eq!(d.typer() & 0x1F, 8);
        assert_eq!((d.typer() >> 19) & 0x1F, 13, "IDbits 14 for 8192 LPIs");
        assert_eq!(d.mmio_read(regs::PIDR2), Ok(0x30));
        d.mmio_write(regs::CTLR, u64::from(CTLR_ENABLE_GRP1))
            .unwrap();
        assert_eq!(d.ctlr(), CTLR_ENABLE_GRP1 | CTLR_ARE | CTLR_DS);
        assert!(d.mmio_write(regs::CTLR, 1 << 8).is_err());
        let r = Route::Affinity(Affinity {
            aff1: 0,
            aff0: 3,
            ..Affinity::default()
        });
        d.mmio_write(regs::IROUTER + 8 * 45, r.encode()).unwrap();
        assert_eq!(d.route(45), Ok(r));
        assert_eq!(d.mmio_read(regs::IROUTER + 8 * 45), Ok(3));
        d.mmio_write(regs::IROUTER + 8 * 46, IROUTER_IRM).unwrap();
        assert_eq!(d.route(46), Ok(Route::OneOfN));
        assert!(d.mmio_write(regs::IROUTER + 8 * 46, 1 << 40).is_err());
        // Enabling and pending through the bank registers.
        d.mmio_write(offsets::ISENABLER + 4, 1 << 13).unwrap();
        d.mmio_write(offsets::IGROUPR + 4, 1 << 13).unwrap();
        d.mmio_write(offsets::IPRIORITYR + 45, 0x40 << 8).unwrap();
        d.mmio_write(offsets::ISPENDR + 4, 1 << 13).unwrap();
        assert_eq!(d.candidate(3, None).map(|c| c.priority), Some(0x40));
        assert_eq!(d.mmio_write(regs::TYPER, 0), Err(GicError::ReadOnly(4)));
        assert_eq!(d.mmio_read(0x9000), Err(GicError::Offset(0x9000)));
        assert_eq!(d.set_spi_line(31, true), Err(GicError::Intid(31)));
        assert_eq!(d.set_spi_line(288, true), Err(GicError::Intid(288)));
    }
}
