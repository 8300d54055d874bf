//! The GICv3/v4 redistributor (GICR), one per core (GICv3 spec §2.1, §5 "
//! Locality-specific Peripheral Interrupts and the ITS", §12.10/§12.11
//! register maps; did-arm.md §2.3 and §2.6).
//!
//! It holds the core's banked SGIs and PPIs (INTIDs 0..31), its view of the
//! physical LPIs (INTID ≥ 8192): the shared LPI configuration table in memory
//! (GICR_PROPBASER: priority and enable per LPI), which it caches and re-reads
//! only on an invalidation (GICR_INVLPIR/INVALLR or the ITS's INV/INVALL),
//! and its own LPI pending table (GICR_PENDBASER), set by GICR_SETLPIR or by
//! the ITS. It presents the best of them to the core's CPU interface.
//!
//! With GICv4 it also knows which vPE is resident on the core
//! (GICR_VPENDBASER.Valid plus the vPE id, GICv4.1 style). A vLPI the ITS
//! sends here for the resident vPE is delivered straight to the virtual CPU
//! interface; one for another vPE is only recorded in that vPE's virtual
//! pending table, and if its doorbell is set the redistributor makes the
//! doorbell — an ordinary physical LPI — pending, so that the host learns
//! the vPE needs to run (did-arm.md §2.6, §7.5). The vPEs' tables live in
//! memory shared by all redistributors ([`VlpiTables`]), so a vPE moved with
//! VMOVP finds its pending vLPIs wherever it is made resident.

use crate::hw::arm::bank::IrqBank;
use crate::hw::arm::intid::{class, Bitmap, GicError, IntidClass, LPI_BASE, PPI_BASE, SPI_BASE};
use crate::hw::arm::params::{Affinity, GicParams};
use crate::hw::arm::priority::{pick, priority_mask, Candidate, Group};

/// GICR register offsets, from RD_base (the SGI_base frame follows at
/// [`regs::SGI_BASE`], the GICv4 VLPI frame at [`regs::VLPI_BASE`]).
pub mod regs {
    /// Control register (EnableLPIs in bit 0).
    pub const CTLR: u64 = 0x0000;
    /// Implementer identification.
    pub const IIDR: u64 = 0x0004;
    /// Type register (64-bit; affinity in \[63:32\]).
    pub const TYPER: u64 = 0x0008;
    /// Power management (ProcessorSleep, ChildrenAsleep).
    pub const WAKER: u64 = 0x0014;
    /// Set LPI pending (write-only, 64-bit).
    pub const SETLPIR: u64 = 0x0040;
    /// Clear LPI pending (write-only, 64-bit).
    pub const CLRLPIR: u64 = 0x0048;
    /// LPI configuration table base.
    pub const PROPBASER: u64 = 0x0070;
    /// LPI pending table base.
    pub const PENDBASER: u64 = 0x0078;
    /// Invalidate the cached configuration of one LPI.
    pub const INVLPIR: u64 = 0x00A0;
    /// Invalidate the cached configuration of every LPI.
    pub const INVALLR: u64 = 0x00B0;
    /// Synchronize (reads 0: never busy in the model).
    pub const SYNCR: u64 = 0x00C0;
    /// The SGI/PPI frame.
    pub const SGI_BASE: u64 = 0x1_0000;
    /// The GICv4 virtual-LPI frame.
    pub const VLPI_BASE: u64 = 0x2_0000;
    /// Virtual LPI configuration table base (VLPI frame).
    pub const VPROPBASER: u64 = VLPI_BASE + 0x0070;
    /// Virtual LPI pending table base and residency (VLPI frame).
    pub const VPENDBASER: u64 = VLPI_BASE + 0x0078;
}

/// GICR_CTLR.EnableLPIs.
pub const CTLR_ENABLE_LPIS: u32 = 1 << 0;
/// GICR_WAKER.ProcessorSleep.
pub const WAKER_PROCESSOR_SLEEP: u32 = 1 << 1;
/// GICR_WAKER.ChildrenAsleep.
pub const WAKER_CHILDREN_ASLEEP: u32 = 1 << 2;
/// GICR_VPENDBASER.Valid: a vPE is resident.
pub const VPENDBASER_VALID: u64 = 1 << 63;
/// GICR_VPENDBASER.Doorbell (GICv4.1): written with Valid = 0, asks for
/// the vPE's default doorbell if an interrupt arrives for it while it is
/// not resident (Linux's `GICR_VPENDBASER_4_1_DB`, set by
/// `its_vpe_4_1_deschedule` only when KVM wants a doorbell: IN_WFI).
pub const VPENDBASER_DOORBELL: u64 = 1 << 62;
/// GICR_VPENDBASER.PendingLast: read after descheduling, the vPE had
/// pending vLPIs (GICv4.1).
pub const VPENDBASER_PENDING_LAST: u64 = 1 << 61;
/// GICR_VPENDBASER.VPEID (GICv4.1 layout).
pub const VPENDBASER_VPEID: u64 = 0xFFFF;
/// LPI configuration byte: Enable.
pub const LPI_CONFIG_ENABLE: u8 = 1 << 0;
/// LPI configuration byte: bit 1 is RES1.
pub const LPI_CONFIG_RES1: u8 = 1 << 1;
/// LPI configuration byte: priority in bits \[7:2\].
pub const LPI_CONFIG_PRIORITY: u8 = 0xFC;

/// The LPI configuration table in memory (GICR_PROPBASER), one byte per
/// LPI: priority \[7:2\], RES1 \[1\], enable \[0\]. Software writes it directly;
/// redistributors see a change only once it is invalidated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LpiConfigTable {
    bytes: Box<[u8]>,
}

impl LpiConfigTable {
    /// A table for `lpis` LPIs, every one disabled at priority 0.
    pub fn new(lpis: u32) -> Self {
        LpiConfigTable {
            bytes: vec![LPI_CONFIG_RES1; lpis as usize].into_boxed_slice(),
        }
    }

    /// The configuration byte of `intid`.
    pub fn get(&self, intid: u32) -> Option<u8> {
        let i = intid.checked_sub(LPI_BASE)?;
        self.bytes.get(i as usize).copied()
    }

    /// Writes the configuration of `intid` (a store to the table; no
    /// redistributor sees it before an invalidation).
    pub fn set(&mut self, intid: u32, priority: u8, enabled: bool) -> Result<(), GicError> {
        let i = intid.checked_sub(LPI_BASE).ok_or(GicError::Intid(intid))?;
        let b = self
            .bytes
            .get_mut(i as usize)
            .ok_or(GicError::Intid(intid))?;
        *b = (priority & LPI_CONFIG_PRIORITY) | LPI_CONFIG_RES1 | u8::from(enabled);
        Ok(())
    }

    /// How many LPIs the table describes.
    pub fn len(&self) -> u32 {
        self.bytes.len() as u32
    }

    /// Whether the table describes no LPI.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The best enabled pending LPI (or vLPI) of a pending table, given the
/// enables and priorities it is configured with: word-wise, no allocation.
fn best_lpi(pending: &Bitmap, enabled: &Bitmap, priority: &[u8]) -> Option<Candidate> {
    let mut best = None;
    for (w, (&p, &e)) in pending.words().iter().zip(enabled.words()).enumerate() {
        let mut ready = p & e;
        while ready != 0 {
            let i = w as u32 * 64 + ready.trailing_zeros();
            ready &= ready - 1;
            best = pick(
                best,
                Some(Candidate {
                    intid: LPI_BASE + i,
                    priority: priority[i as usize],
                    group: Group::G1,
                }),
            );
        }
    }
    best
}

/// GICv4.1 vSGI state of one vPE (configured by the VSGI command).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct VsgiState {
    pending: u16,
    enabled: u16,
    group1: u16,
    priority: [u8; 16],
}

/// Every vPE's virtual LPI tables, in memory: the virtual pending table
/// (GICR_VPENDBASER / VMAPP's VPT) and the virtual LPI configuration
/// (GICR_VPROPBASER, here one per vPE), plus GICv4.1 vSGI state. The guest's
/// configuration is read live: the model keeps no vLPI configuration cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VlpiTables {
    pending: Vec<Bitmap>,
    enabled: Vec<Bitmap>,
    priority: Vec<Box<[u8]>>,
    vsgi: Vec<VsgiState>,
    /// GICv4.1: the vPE's default doorbell is wanted (GICR_VPENDBASER.
    /// Doorbell at its last deschedule; a vPE never scheduled wants it).
    /// One-shot: cleared when the doorbell rings or the vPE is resident.
    doorbell_wanted: Vec<bool>,
    mask: u8,
}

impl VlpiTables {
    /// Tables for `vpes` vPEs of `vlpis` vLPIs each, every vLPI disabled
    /// and idle; virtual priorities cut to `priority_bits`.
    pub fn new(vpes: u16, vlpis: u32, priority_bits: u8) -> Self {
        let n = usize::from(vpes);
        VlpiTables {
            pending: vec![Bitmap::new(vlpis); n],
            enabled: vec![Bitmap::new(vlpis); n],
            priority: vec![vec![0; vlpis as usize].into_boxed_slice(); n],
            vsgi: vec![VsgiState::default(); n],
            doorbell_wanted: vec![true; n],
            mask: priority_mask(priority_bits),
        }
    }

    /// The tables of `params`' vPEs.
    pub fn for_params(params: &GicParams) -> Self {
        Self::new(
            params.redistributor.vpes,
            params.redistributor.vlpis,
            params.vcpu_interface.priority_bits,
        )
    }

    /// How many vPEs there are tables for.
    pub fn vpes(&self) -> u16 {
        self.pending.len() as u16
    }

    fn slot(&self, vpeid: u16, vintid: u32) -> Result<(usize, u32), GicError> {
        let v = usize::from(vpeid);
        let bits = self.pending.get(v).ok_or(GicError::Vpe(vpeid))?;
        match vintid.checked_sub(LPI_BASE) {
            Some(i) if i < bits.len() => Ok((v, i)),
            _ => Err(GicError::Intid(vintid)),
        }
    }

    /// The guest configures vLPI `vintid` of `vpeid` (its LPI configuration
    /// table entry).
    pub fn set_config(
        &mut self,
        vpeid: u16,
        vintid: u32,
        priority: u8,
        enabled: bool,
    ) -> Result<(), GicError> {
        let (v, i) = self.slot(vpeid, vintid)?;
        self.enabled[v].assign(i, enabled);
        self.priority[v][i as usize] = priority & LPI_CONFIG_PRIORITY & self.mask;
        Ok(())
    }

    /// Sets vLPI `vintid` (or, below 16, GICv4.1 vSGI `vintid`) pending in
    /// `vpeid`'s pending state; true if it was not pending.
    pub fn set_pending(&mut self, vpeid: u16, vintid: u32) -> Result<bool, GicError> {
        if vintid < PPI_BASE {
            return self.raise_vsgi(vpeid, vintid);
        }
        let (v, i) = self.slot(vpeid, vintid)?;
        Ok(self.pending[v].set(i))
    }

    /// Clears vLPI `vintid` of `vpeid`; true if it was pending.
    pub fn clear_pending(&mut self, vpeid: u16, vintid: u32) -> Result<bool, GicError> {
        let (v, i) = self.slot(vpeid, vintid)?;
        Ok(self.pending[v].clear(i))
    }

    /// Whether vLPI `vintid` of `vpeid` is pending.
    pub fn is_pending(&self, vpeid: u16, vintid: u32) -> bool {
        self.slot(vpeid, vintid)
            .is_ok_and(|(v, i)| self.pending[v].test(i))
    }

    /// Whether `vpeid` has any pending vLPI or vSGI, enabled or not (what
    /// GICR_VPENDBASER.PendingLast reports).
    pub fn any_pending(&self, vpeid: u16) -> bool {
        let v = usize::from(vpeid);
        self.pending.get(v).is_some_and(|p| !p.none())
            || self.vsgi.get(v).is_some_and(|s| s.pending != 0)
    }

    /// The best enabled pending vLPI or vSGI of `vpeid` (vLPIs and vSGIs
    /// are group 1 unless a vSGI was configured group 0).
    pub fn best(&self, vpeid: u16) -> Option<Candidate> {
        let v = usize::from(vpeid);
        let mut best = best_lpi(self.pending.get(v)?, &self.enabled[v], &self.priority[v]);
        let s = &self.vsgi[v];
        let ready = s.pending & s.enabled;
        for sgi in (0..16u32).filter(|k| ready & (1 << k) != 0) {
            best = pick(
                best,
                Some(Candidate {
                    intid: sgi,
                    priority: s.priority[sgi as usize],
                    group: Group::from_bit(s.group1 & (1 << sgi) != 0),
                }),
            );
        }
        best
    }

    fn vsgi_slot(&mut self, vpeid: u16, sgi: u32) -> Result<&mut VsgiState, GicError> {
        let s = self
            .vsgi
            .get_mut(usize::from(vpeid))
            .ok_or(GicError::Vpe(vpeid))?;
        if sgi >= 16 {
            return Err(GicError::Intid(sgi));
        }
        Ok(s)
    }

    /// GICv4.1 VSGI command: configures vSGI `sgi` of `vpeid`, or clears its
    /// pending state.
    pub fn configure_vsgi(
        &mut self,
        vpeid: u16,
        sgi: u32,
        priority: u8,
        group: Group,
        enabled: bool,
        clear: bool,
    ) -> Result<(), GicError> {
        let mask = self.mask;
        let s = self.vsgi_slot(vpeid, sgi)?;
        let bit = 1u16 << sgi;
        if clear {
            s.pending &= !bit;
            return Ok(());
        }
        s.priority[sgi as usize] = priority & mask;
        s.group1 = if group == Group::G1 {
            s.group1 | bit
        } else {
            s.group1 & !bit
        };
        s.enabled = if enabled {
            s.enabled | bit
        } else {
            s.enabled & !bit
        };
        Ok(())
    }

    /// A vSGI for `vpeid` (GICv4.1 GITS_SGIR / GICR_VSGIR); true if newly
    /// pending.
    pub fn raise_vsgi(&mut self, vpeid: u16, sgi: u32) -> Result<bool, GicError> {
        let s = self.vsgi_slot(vpeid, sgi)?;
        let was = s.pending & (1 << sgi) != 0;
        s.pending |= 1 << sgi;
        Ok(!was)
    }

    /// Whether vSGI `sgi` of `vpeid` is pending (GICR_VSGIPENDR as
    /// `its_sgi_get_irqchip_state` reads it through GICR_VSGIR).
    pub fn vsgi_pending(&self, vpeid: u16, sgi: u32) -> bool {
        match self.vsgi.get(usize::from(vpeid)) {
            Some(s) if sgi < 16 => s.pending & (1 << sgi) != 0,
            _ => false,
        }
    }

    /// GICv4.1: whether `vpeid`'s default doorbell is wanted now.
    pub fn doorbell_wanted(&self, vpeid: u16) -> bool {
        self.doorbell_wanted
            .get(usize::from(vpeid))
            .copied()
            .unwrap_or(false)
    }

    /// GICv4.1: sets whether `vpeid`'s default doorbell is wanted (the
    /// Doorbell bit of its deschedule; cleared once it rang).
    pub fn set_doorbell_wanted(&mut self, vpeid: u16, on: bool) {
        if let Some(w) = self.doorbell_wanted.get_mut(usize::from(vpeid)) {
            *w = on;
        }
    }
}

/// The directly injected interrupts of the vPE resident on a core, as the
/// virtual CPU interface sees them: its enabled pending vLPIs and, with
/// GICv4.1, its vSGIs. Neither has an active state: acknowledging one
/// clears its pending bit. A directly injected vSGI is an "SGI without
/// active state", which is why KVM offers vSGIs only to a guest that sets
/// GICD_CTLR.nASSGIreq (vgic_v4_configure_vsgis; the guest's GICv3 driver
/// sets it when GICD_TYPER2.nASSGIcap says it may, gic_dist_init).
pub struct DirectVlpis<'a> {
    vpeid: u16,
    tables: &'a mut VlpiTables,
}

impl DirectVlpis<'_> {
    /// The resident vPE.
    pub fn vpeid(&self) -> u16 {
        self.vpeid
    }

    /// The best directly injected interrupt pending.
    pub fn best(&self) -> Option<Candidate> {
        self.tables.best(self.vpeid)
    }

    /// The guest acknowledges `vintid`: a vLPI leaves the pending table, a
    /// vSGI its pending state (no active state for either). False if it
    /// was not pending.
    pub fn acknowledge(&mut self, vintid: u32) -> bool {
        if vintid < 16 {
            let Some(s) = self.tables.vsgi.get_mut(usize::from(self.vpeid)) else {
                return false;
            };
            let was = s.pending & (1 << vintid) != 0;
            s.pending &= !(1 << vintid);
            return was;
        }
        self.tables
            .clear_pending(self.vpeid, vintid)
            .unwrap_or(false)
    }
}

/// What became of a vLPI the ITS sent to this redistributor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VlpiPost {
    /// The vPE is resident here: the vLPI reaches the virtual CPU interface
    /// with no hypervisor involvement.
    Resident {
        /// False if the vLPI was pending already (it merges).
        newly_pending: bool,
    },
    /// The vPE is not resident: the vLPI waits in its pending table.
    NotResident {
        /// False if the vLPI was pending already.
        newly_pending: bool,
        /// The doorbell LPI made pending, if the ITE (or the vPE) has one
        /// and LPIs are enabled here.
        doorbell: Option<Doorbell>,
    },
}

/// A doorbell rung for a non-resident vPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doorbell {
    /// The physical LPI.
    pub intid: u32,
    /// Whether it reaches the host now: the doorbell LPI is enabled (KVM's
    /// GICv4.0 code disables it while the vCPU runs) and was not already
    /// pending.
    pub signalled: bool,
}

/// Event counts of one redistributor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedistributorCounters {
    /// SGIs received (newly pending).
    pub sgis: u64,
    /// PPIs that became pending.
    pub ppis: u64,
    /// LPIs set pending (SETLPIR or ITS).
    pub lpis: u64,
    /// LPIs set while already pending (merged).
    pub lpis_merged: u64,
    /// LPIs refused because GICR_CTLR.EnableLPIs is 0.
    pub lpis_dropped: u64,
    /// Acknowledges.
    pub acks: u64,
    /// Deactivations of an active SGI/PPI.
    pub deactivations: u64,
    /// vLPIs delivered to the resident vPE.
    pub vlpis_resident: u64,
    /// vLPIs recorded for a non-resident vPE.
    pub vlpis_not_resident: u64,
    /// Doorbells made pending.
    pub doorbells: u64,
    /// LPI configuration invalidations (one LPI or all).
    pub invalidations: u64,
}

/// One core's redistributor.
#[derive(Clone, Debug)]
pub struct Redistributor {
    core: usize,
    affinity: Affinity,
    last: bool,
    gicv4: bool,
    bank: IrqBank,
    lpis_enabled: bool,
    lpi_pending: Bitmap,
    cached_enabled: Bitmap,
    cached_priority: Box<[u8]>,
    mask: u8,
    propbaser: u64,
    pendbaser: u64,
    asleep: bool,
    resident: Option<u16>,
    vpes: u16,
    pending_last: bool,
    counters: RedistributorCounters,
}

impl Redistributor {
    /// Core `core`'s redistributor in reset state: SGIs/PPIs disabled, LPIs
    /// disabled, no vPE resident, the core awake.
    pub fn new(core: usize, params: &GicParams) -> Self {
        let lpis = params.redistributor.lpis;
        Redistributor {
            core,
            affinity: params.topology.affinity(core),
            last: core + 1 == params.topology.cores,
            gicv4: params.gicv4,
            bank: IrqBank::new(0, SPI_BASE, params.cpu_interface.priority_bits, PPI_BASE),
            lpis_enabled: false,
            lpi_pending: Bitmap::new(lpis),
            cached_enabled: Bitmap::new(lpis),
            cached_priority: vec![0; lpis as usize].into_boxed_slice(),
            mask: priority_mask(params.cpu_interface.priority_bits),
            propbaser: 0,
            pendbaser: 0,
            asleep: false,
            resident: None,
            vpes: params.redistributor.vpes,
            pending_last: false,
            counters: RedistributorCounters::default(),
        }
    }

    /// The core this redistributor serves.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Its affinity (GICR_TYPER.Affinity_Value).
    pub fn affinity(&self) -> Affinity {
        self.affinity
    }

    /// The SGI/PPI state.
    pub fn bank(&self) -> &IrqBank {
        &self.bank
    }

    /// The SGI/PPI state, to configure directly.
    pub fn bank_mut(&mut self) -> &mut IrqBank {
        &mut self.bank
    }

    /// Event counts so far.
    pub fn counters(&self) -> RedistributorCounters {
        self.counters
    }

    /// Configures SGI/PPI `intid`: priority, group, enable.
    pub fn configure(&mut self, intid: u32, priority: u8, group: Group) -> Result<(), GicError> {
        self.bank.set_priority(intid, priority)?;
        self.bank.set_group(intid, group)?;
        self.bank.set_enabled(intid, true)
    }

    /// Drives PPI `intid`'s line (a timer's output, the maintenance
    /// interrupt); true if it became pending.
    pub fn set_ppi_line(&mut self, intid: u32, level: bool) -> Result<bool, GicError> {
        if class(intid) != IntidClass::Ppi {
            return Err(GicError::Intid(intid));
        }
        let became = self.bank.set_line(intid, level)?;
        self.counters.ppis += u64::from(became);
        Ok(became)
    }

    /// An SGI `intid` arrives from some core's ICC_SGI1R_EL1; true if it
    /// became pending (SGIs merge while pending).
    pub fn raise_sgi(&mut self, intid: u32) -> Result<bool, GicError> {
        if class(intid) != IntidClass::Sgi {
            return Err(GicError::Intid(intid));
        }
        let became = self.bank.set_pending(intid)?;
        self.counters.sgis += u64::from(became);
        Ok(became)
    }

    fn lpi_index(&self, intid: u32) -> Result<u32, GicError> {
        match intid.checked_sub(LPI_BASE) {
            Some(i) if i < self.lpi_pending.len() => Ok(i),
            _ => Err(GicError::Intid(intid)),
        }
    }

    /// Whether GICR_CTLR.EnableLPIs is set.
    pub fn lpis_enabled(&self) -> bool {
        self.lpis_enabled
    }

    /// Sets or clears GICR_CTLR.EnableLPIs. Enabling reads the whole
    /// configuration table into the cache.
    pub fn set_lpis_enabled(&mut self, on: bool, table: &LpiConfigTable) {
        if on && !self.lpis_enabled {
            self.invalidate_all(table);
        }
        self.lpis_enabled = on;
    }

    /// Makes LPI `intid` pending (GICR_SETLPIR, or the ITS). Returns whether
    /// it was newly pending. Refused while LPIs are disabled.
    pub fn set_lpi_pending(&mut self, intid: u32) -> Result<bool, GicError> {
        let i = self.lpi_index(intid)?;
        if !self.lpis_enabled {
            self.counters.lpis_dropped += 1;
            return Err(GicError::LpisDisabled);
        }
        let newly = self.lpi_pending.set(i);
        if newly {
            self.counters.lpis += 1;
        } else {
            self.counters.lpis_merged += 1;
        }
        Ok(newly)
    }

    /// Clears LPI `intid`'s pending bit (GICR_CLRLPIR, DISCARD, CLEAR, or a
    /// move away); true if it was pending.
    pub fn clear_lpi_pending(&mut self, intid: u32) -> Result<bool, GicError> {
        let i = self.lpi_index(intid)?;
        Ok(self.lpi_pending.clear(i))
    }

    /// Whether LPI `intid` is pending here.
    pub fn lpi_pending(&self, intid: u32) -> bool {
        self.lpi_index(intid)
            .is_ok_and(|i| self.lpi_pending.test(i))
    }

    /// The configuration this redistributor uses for LPI `intid` (its
    /// cache): (priority, enabled).
    pub fn lpi_config(&self, intid: u32) -> Option<(u8, bool)> {
        let i = self.lpi_index(intid).ok()?;
        Some((
            self.cached_priority[i as usize],
            self.cached_enabled.test(i),
        ))
    }

    /// Whether LPI `intid` is pending and enabled, i.e. offered to the core.
    pub fn lpi_deliverable(&self, intid: u32) -> bool {
        self.lpi_pending(intid) && self.lpi_config(intid).is_some_and(|(_, e)| e)
    }

    /// Re-reads LPI `intid`'s configuration from `table` (GICR_INVLPIR, ITS
    /// INV).
    pub fn invalidate_lpi(&mut self, intid: u32, table: &LpiConfigTable) -> Result<(), GicError> {
        let i = self.lpi_index(intid)?;
        let b = table.get(intid).unwrap_or(LPI_CONFIG_RES1);
        self.cached_enabled.assign(i, b & LPI_CONFIG_ENABLE != 0);
        self.cached_priority[i as usize] = b & LPI_CONFIG_PRIORITY & self.mask;
        self.counters.invalidations += 1;
        Ok(())
    }

    /// Re-reads the whole configuration table (GICR_INVALLR, ITS INVALL).
    pub fn invalidate_all(&mut self, table: &LpiConfigTable) {
        for i in 0..self.lpi_pending.len() {
            let b = table.get(LPI_BASE + i).unwrap_or(LPI_CONFIG_RES1);
            self.cached_enabled.assign(i, b & LPI_CONFIG_ENABLE != 0);
            self.cached_priority[i as usize] = b & LPI_CONFIG_PRIORITY & self.mask;
        }
        self.counters.invalidations += 1;
    }

    /// Moves LPI `intid`'s pending state to `to` (MOVI); true if it was
    /// pending here. If `to` has LPIs disabled the state is dropped.
    pub fn move_lpi(&mut self, intid: u32, to: &mut Redistributor) -> Result<bool, GicError> {
        let was = self.clear_lpi_pending(intid)?;
        if was {
            // A refusal is counted at `to`; the move itself succeeded.
            to.set_lpi_pending(intid).ok();
        }
        Ok(was)
    }

    /// Moves every pending LPI to `to` (MOVALL); returns how many.
    pub fn move_all_lpis(&mut self, to: &mut Redistributor) -> u32 {
        let mut n = 0;
        for w in 0..self.lpi_pending.words().len() {
            let mut bits = self.lpi_pending.words()[w];
            while bits != 0 {
                let i = w as u32 * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                if self.move_lpi(LPI_BASE + i, to).unwrap_or(false) {
                    n += 1;
                }
            }
        }
        n
    }

    fn best_lpi(&self) -> Option<Candidate> {
        if !self.lpis_enabled {
            return None;
        }
        best_lpi(
            &self.lpi_pending,
            &self.cached_enabled,
            &self.cached_priority,
        )
    }

    /// The best interrupt this redistributor offers its CPU interface: an
    /// SGI/PPI (pending, enabled, not active) or an enabled pending LPI
    /// (LPIs are group 1). `group` None means either group.
    pub fn candidate(&self, group: Option<Group>) -> Option<Candidate> {
        let lpi = match group {
            None | Some(Group::G1) => self.best_lpi(),
            Some(Group::G0) => None,
        };
        pick(self.bank.best(group, |_| true), lpi)
    }

    /// The core acknowledges `intid`: an SGI/PPI becomes active, an LPI
    /// leaves the pending table (LPIs have no active state).
    pub fn acknowledge(&mut self, intid: u32) -> Result<(), GicError> {
        if class(intid) == IntidClass::Lpi {
            self.clear_lpi_pending(intid)?;
        } else {
            self.bank.acknowledge(intid)?;
        }
        self.counters.acks += 1;
        Ok(())
    }

    /// Deactivates SGI/PPI `intid`; returns whether it was active. An LPI
    /// has nothing to deactivate (Ok(false)).
    pub fn deactivate(&mut self, intid: u32) -> Result<bool, GicError> {
        if class(intid) == IntidClass::Lpi {
            self.lpi_index(intid)?;
            return Ok(false);
        }
        let was = self.bank.set_active(intid, false)?;
        self.counters.deactivations += u64::from(was);
        Ok(was)
    }

    fn vpe_check(&self, vpeid: u16) -> Result<(), GicError> {
        if !self.gicv4 {
            return Err(GicError::Unsupported("GICv4 vPE residency"));
        }
        if vpeid >= self.vpes {
            return Err(GicError::Vpe(vpeid));
        }
        Ok(())
    }

    /// The vPE resident here (GICR_VPENDBASER.Valid and its id).
    pub fn resident(&self) -> Option<u16> {
        self.resident
    }

    /// Schedules `vpeid` in (GICR_VPENDBASER.Valid 0 -> 1). Returns whether
    /// it has pending vLPIs, which the virtual CPU interface now sees.
    /// Refused while another vPE is resident.
    pub fn make_resident(&mut self, vpeid: u16, tables: &mut VlpiTables) -> Result<bool, GicError> {
        self.vpe_check(vpeid)?;
        if self.resident.is_some() {
            return Err(GicError::Reserved {
                reg: "GICR_VPENDBASER (already valid)",
                value: u64::from(vpeid),
            });
        }
        self.resident = Some(vpeid);
        tables.set_doorbell_wanted(vpeid, false);
        Ok(tables.any_pending(vpeid))
    }

    /// Schedules the resident vPE out (Valid 1 -> 0), with GICv4.1's
    /// Doorbell bit `doorbell` (whether its default doorbell should ring
    /// for an interrupt that arrives while it is out; GICv4.0 ignores it).
    /// Returns the vPE and PendingLast: whether it still has pending
    /// interrupts (KVM's `pending_last`).
    pub fn make_non_resident(
        &mut self,
        tables: &mut VlpiTables,
        doorbell: bool,
    ) -> Option<(u16, bool)> {
        let v = self.resident.take()?;
        self.pending_last = tables.any_pending(v);
        tables.set_doorbell_wanted(v, doorbell);
        Some((v, self.pending_last))
    }

    /// A vLPI from the ITS for `vpeid`, with the doorbell the ITE or vPE
    /// names (None: no doorbell, INTID 1023 in the command).
    pub fn post_vlpi(
        &mut self,
        vpeid: u16,
        vintid: u32,
        doorbell: Option<u32>,
        tables: &mut VlpiTables,
    ) -> Result<VlpiPost, GicError> {
        self.vpe_check(vpeid)?;
        let newly_pending = tables.set_pending(vpeid, vintid)?;
        if self.resident == Some(vpeid) {
            self.counters.vlpis_resident += 1;
            return Ok(VlpiPost::Resident { newly_pending });
        }
        self.counters.vlpis_not_resident += 1;
        let doorbell = match doorbell {
            Some(db) => match self.set_lpi_pending(db) {
                Ok(newly) => {
                    self.counters.doorbells += 1;
                    Some(Doorbell {
                        intid: db,
                        signalled: newly && self.lpi_deliverable(db),
                    })
                }
                // LPIs disabled, or a doorbell outside the LPI range: no
                // doorbell (counted by set_lpi_pending where it applies).
                Err(_) => None,
            },
            None => None,
        };
        Ok(VlpiPost::NotResident {
            newly_pending,
            doorbell,
        })
    }

    /// The resident vPE's directly injected interrupts, for the virtual CPU
    /// interface; None when no vPE is resident.
    pub fn direct_vlpis<'a>(&self, tables: &'a mut VlpiTables) -> Option<DirectVlpis<'a>> {
        let vpeid = self.resident?;
        (vpeid < tables.vpes()).then_some(DirectVlpis { vpeid, tables })
    }

    /// GICR_TYPER: affinity, processor number, Last, PLPIS, VLPIS,
    /// DirectLPI.
    pub fn typer(&self) -> u64 {
        let a = self.affinity;
        let aff = u64::from(a.aff0)
            | (u64::from(a.aff1) << 8)
            | (u64::from(a.aff2) << 16)
            | (u64::from(a.aff3) << 24);
        (aff << 32)
            | ((self.core as u64 & 0xFFFF) << 8)
            | (u64::from(self.last) << 4)
            | (1 << 3)
            | (u64::from(self.gicv4) << 1)
            | 1
    }

    /// A 32- or 64-bit MMIO read at `offset` from RD_base (SGI_base and
    /// VLPI_base frames included).
    pub fn mmio_read(&self, offset: u64) -> Result<u64, GicError> {
        if let Some(rel) = offset.checked_sub(regs::SGI_BASE) {
            if let Some(v) = self.bank.mmio_read(rel) {
                return Ok(u64::from(v));
            }
        }
        match offset {
            regs::CTLR => Ok(u64::from(self.lpis_enabled)),
            regs::IIDR => Ok(0x43B),
            regs::TYPER => Ok(self.typer()),
            regs::WAKER => Ok(if self.asleep {
                u64::from(WAKER_PROCESSOR_SLEEP | WAKER_CHILDREN_ASLEEP)
            } else {
                0
            }),
            regs::PROPBASER => Ok(self.propbaser),
            regs::PENDBASER => Ok(self.pendbaser),
            regs::SYNCR => Ok(0),
            regs::VPENDBASER if self.gicv4 => Ok(match self.resident {
                Some(v) => VPENDBASER_VALID | u64::from(v),
                None if self.pending_last => VPENDBASER_PENDING_LAST,
                None => 0,
            }),
            regs::SETLPIR | regs::CLRLPIR | regs::INVLPIR | regs::INVALLR => {
                Err(GicError::Offset(offset))
            }
            o => Err(GicError::Offset(o)),
        }
    }

    /// A 32- or 64-bit MMIO write at `offset` from RD_base. LPI registers
    /// need the configuration table; VPENDBASER the vPE tables.
    pub fn mmio_write(
        &mut self,
        offset: u64,
        value: u64,
        table: &LpiConfigTable,
        vtables: &mut VlpiTables,
    ) -> Result<(), GicError> {
        if let Some(rel) = offset.checked_sub(regs::SGI_BASE) {
            if rel < regs::SGI_BASE && self.bank.mmio_write(rel, value as u32).is_some() {
                return Ok(());
            }
        }
        let intid = |value: u64| -> Result<u32, GicError> {
            u32::try_from(value).map_err(|_| GicError::Reserved {
                reg: "GICR LPI INTID",
                value,
            })
        };
        match offset {
            regs::CTLR => {
                if value & !u64::from(CTLR_ENABLE_LPIS) != 0 {
                    return Err(GicError::Reserved {
                        reg: "GICR_CTLR",
                        value,
                    });
                }
                self.set_lpis_enabled(value != 0, table);
                Ok(())
            }
            regs::WAKER => {
                self.asleep = value & u64::from(WAKER_PROCESSOR_SLEEP) != 0;
                Ok(())
            }
            regs::PROPBASER => {
                self.propbaser = value;
                Ok(())
            }
            regs::PENDBASER => {
                self.pendbaser = value;
                Ok(())
            }
            regs::SETLPIR => self.set_lpi_pending(intid(value)?).map(drop),
            regs::CLRLPIR => self.clear_lpi_pending(intid(value)?).map(drop),
            regs::INVLPIR => self.invalidate_lpi(intid(value)?, table),
            regs::INVALLR => {
                self.invalidate_all(table);
                Ok(())
            }
            regs::VPENDBASER if self.gicv4 => {
                if value & VPENDBASER_VALID != 0 {
                    let vpeid = (value & VPENDBASER_VPEID) as u16;
                    self.make_resident(vpeid, vtables).map(drop)
                } else {
                    self.make_non_resident(vtables, value & VPENDBASER_DOORBELL != 0);
                    Ok(())
                }
            }
            regs::IIDR | regs::TYPER | regs::SYNCR => Err(GicError::ReadOnly(offset)),
            o => Err(GicError::Offset(o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::arm::bank::offsets;

    fn params() -> GicParams {
        GicParams::gicv4(4, 8)
    }

    fn rd(core: usize) -> Redistributor {
        Redistributor::new(core, &params())
    }

    fn table() -> LpiConfigTable {
        LpiConfigTable::new(params().redistributor.lpis)
    }

    /// Core 2's redistributor with LPIs on and doorbell LPI 9000 enabled;
    /// vPE 5's vLPI 8500 enabled at priority 0x60.
    fn doorbell_rig() -> (Redistributor, LpiConfigTable, VlpiTables) {
        let mut r = rd(2);
        let mut t = table();
        t.set(9000, 0x80, true).unwrap();
        r.set_lpis_enabled(true, &t);
        let mut v = VlpiTables::for_params(&params());
        v.set_config(5, 8500, 0x60, true).unwrap();
        (r, t, v)
    }

    #[test]
    fn sgis_and_ppis_are_banked_and_classed() {
        let mut r = rd(1);
        r.configure(3, 0x80, Group::G1).unwrap();
        r.configure(27, 0x40, Group::G1).unwrap();
        assert_eq!(r.raise_sgi(3), Ok(true));
        assert_eq!(r.raise_sgi(3), Ok(false), "SGIs merge while pending");
        assert_eq!(r.raise_sgi(16), Err(GicError::Intid(16)));
        assert_eq!(r.set_ppi_line(27, true), Ok(true));
        assert_eq!(r.set_ppi_line(3, true), Err(GicError::Intid(3)));
        assert_eq!(r.candidate(None).map(|c| c.intid), Some(27));
        r.acknowledge(27).unwrap();
        assert_eq!(r.candidate(None).map(|c| c.intid), Some(3));
        assert_eq!(r.deactivate(27), Ok(true));
        assert_eq!(r.deactivate(27), Ok(false));
        // Level line still high: pending again after deactivation.
        assert_eq!(r.candidate(None).map(|c| c.intid), Some(27));
    }

    /// kvm-unit-tests arm/gic.c `lpi`: the configuration's enable and
    /// priority are honoured, GICR_SETLPIR makes an LPI pending, and a
    /// configuration change counts only after an invalidation.
    #[test]
    fn lpi_config_enable_priority_and_setlpir() {
        let mut r = rd(0);
        let mut t = table();
        let mut v = VlpiTables::for_params(&params());
        assert_eq!(
            r.mmio_write(regs::SETLPIR, 8192, &t, &mut v),
            Err(GicError::LpisDisabled)
        );
        t.set(8192, 0xA0, true).unwrap();
        t.set(8200, 0x40, false).unwrap();
        r.mmio_write(regs::CTLR, 1, &t, &mut v).unwrap();
        assert_eq!(r.lpi_config(8192), Some((0xA0, true)));
        r.mmio_write(regs::SETLPIR, 8200, &t, &mut v).unwrap();
        assert_eq!(r.candidate(None), None, "LPI 8200 is disabled");
        r.mmio_write(regs::SETLPIR, 8192, &t, &mut v).unwrap();
        let c = r.candidate(None).unwrap();
        assert_eq!((c.intid, c.priority, c.group), (8192, 0xA0, Group::G1));
        // Enabling 8200 at a higher priority: invisible until INVLPIR.
        t.set(8200, 0x40, true).unwrap();
        assert_eq!(r.candidate(None).unwrap().intid, 8192);
        r.mmio_write(regs::INVLPIR, 8200, &t, &mut v).unwrap();
        assert_eq!(r.candidate(None).unwrap().intid, 8200);
        r.acknowledge(8200).unwrap();
        assert!(
            !r.lpi_pending(8200),
            "an acknowledged LPI is no longer pending"
        );
        assert_eq!(r.deactivate(8200), Ok(false), "LPIs have no active state");
        r.mmio_write(regs::CLRLPIR, 8192, &t, &mut v).unwrap();
        assert_eq!(r.candidate(None), None);
        assert_eq!(
            r.mmio_write(regs::SETLPIR, 8192 + 8192, &t, &mut v),
            Err(GicError::Intid(16384))
        );
        assert!(r.mmio_write(regs::SETLPIR, 1 << 40, &t, &mut v).is_err());
    }

    #[test]
    fn invall_and_move() {
        let mut a = rd(0);
        let mut b = rd(1);
        let mut t = table();
        for r in [&mut a, &mut b] {
            r.set_lpis_enabled(true, &t);
        }
        t.set(8300, 0x20, true).unwrap();
        t.set(8301, 0x20, true).unwrap();
        a.set_lpi_pending(8300).unwrap();
        a.set_lpi_pending(8301).unwrap();
        assert_eq!(a.candidate(None), None, "cache still says disabled");
        a.invalidate_all(&t);
        assert!(a.candidate(None).is_some());
        assert_eq!(a.move_lpi(8300, &mut b), Ok(true));
        assert!(!a.lpi_pending(8300) && b.lpi_pending(8300));
        assert_eq!(a.move_all_lpis(&mut b), 1);
        assert!(b.lpi_pending(8301));
    }

    #[test]
    fn vlpi_to_resident_vpe_needs_no_doorbell() {
        let (mut r, _t, mut v) = doorbell_rig();
        assert_eq!(r.make_resident(5, &mut v), Ok(false));
        assert_eq!(
            r.post_vlpi(5, 8500, Some(9000), &mut v),
            Ok(VlpiPost::Resident {
                newly_pending: true
            })
        );
        assert!(!r.lpi_pending(9000), "no doorbell for a resident vPE");
        let mut d = r.direct_vlpis(&mut v).unwrap();
        assert_eq!(d.best().map(|c| (c.intid, c.priority)), Some((8500, 0x60)));
        assert!(d.acknowledge(8500));
        assert_eq!(d.best(), None);
    }

    #[test]
    fn vlpi_to_non_resident_vpe_rings_the_doorbell_and_waits() {
        let (mut r, t, mut v) = doorbell_rig();
        let post = r.post_vlpi(5, 8500, Some(9000), &mut v).unwrap();
        assert_eq!(
            post,
            VlpiPost::NotResident {
                newly_pending: true,
                doorbell: Some(Doorbell {
                    intid: 9000,
                    signalled: true
                })
            }
        );
        assert_eq!(r.candidate(None).map(|c| c.intid), Some(9000));
        assert!(v.is_pending(5, 8500), "the vLPI is kept");
        // A second vLPI while the doorbell is pending merges into it.
        v.set_config(5, 8501, 0x60, true).unwrap();
        match r.post_vlpi(5, 8501, Some(9000), &mut v).unwrap() {
            VlpiPost::NotResident { doorbell, .. } => {
                assert_eq!(doorbell.map(|d| d.signalled), Some(false))
            }
            p => panic!("{p:?}"),
        }
        // Without a doorbell nothing reaches the host.
        let mut r2 = rd(3);
        r2.set_lpis_enabled(true, &t);
        assert_eq!(
            r2.post_vlpi(6, 8500, None, &mut v),
            Ok(VlpiPost::NotResident {
                newly_pending: true,
                doorbell: None
            })
        );
        assert_eq!(r2.candidate(None), None);
        // Scheduling vPE 5 in delivers what waited.
        assert_eq!(r.make_resident(5, &mut v), Ok(true));
        let d = r.direct_vlpis(&mut v).unwrap();
        assert_eq!(d.best().map(|c| c.intid), Some(8500));
    }

    #[test]
    fn a_disabled_doorbell_is_pending_but_not_signalled() {
        let mut r = rd(0);
        let mut t = table();
        t.set(9000, 0x80, false).unwrap();
        r.set_lpis_enabled(true, &t);
        let mut v = VlpiTables::for_params(&params());
        match r.post_vlpi(1, 8200, Some(9000), &mut v).unwrap() {
            VlpiPost::NotResident { doorbell, .. } => assert_eq!(
                doorbell,
                Some(Doorbell {
                    intid: 9000,
                    signalled: false
                })
            ),
            p => panic!("{p:?}"),
        }
        assert_eq!(r.candidate(None), None);
    }

    #[test]
    fn vpendbaser_residency_and_pending_last() {
        let mut r = rd(0);
        let t = table();
        let mut v = VlpiTables::for_params(&params());
        r.mmio_write(regs::VPENDBASER, VPENDBASER_VALID | 3, &t, &mut v)
            .unwrap();
        assert_eq!(r.resident(), Some(3));
        assert_eq!(r.mmio_read(regs::VPENDBASER), Ok(VPENDBASER_VALID | 3));
        assert!(
            r.mmio_write(regs::VPENDBASER, VPENDBASER_VALID | 4, &t, &mut v)
                .is_err(),
            "one vPE at a time"
        );
        v.set_pending(3, 8192).unwrap();
        r.mmio_write(regs::VPENDBASER, 0, &t, &mut v).unwrap();
        assert_eq!(r.resident(), None);
        assert_eq!(r.mmio_read(regs::VPENDBASER), Ok(VPENDBASER_PENDING_LAST));
        assert_eq!(
            r.make_resident(8, &mut v),
            Err(GicError::Vpe(8)),
            "past the vPE table"
        );
        let mut v3 = Redistributor::new(0, &GicParams::gicv3(4));
        assert!(matches!(
            v3.make_resident(0, &mut v),
            Err(GicError::Unsupported(_))
        ));
    }

    #[test]
    fn registers() {
        let mut r = rd(3);
        let t = table();
        let mut v = VlpiTables::for_params(&params());
        let typer = r.mmio_read(regs::TYPER).unwrap();
        assert_eq!(typer >> 32, 3, "Aff0 = 3 in a cluster of 4");
        assert_eq!((typer >> 8) & 0xFFFF, 3);
        assert_ne!(typer & (1 << 4), 0, "last redistributor");
        assert_ne!(typer & 0b11, 0, "PLPIS and VLPIS");
        r.mmio_write(regs::SGI_BASE + offsets::ISENABLER, 1 << 27, &t, &mut v)
            .unwrap();
        assert!(r.bank().is_enabled(27));
        assert_eq!(
            r.mmio_read(regs::SGI_BASE + offsets::ISENABLER),
            Ok(1 << 27)
        );
        r.mmio_write(regs::WAKER, 0, &t, &mut v).unwrap();
        assert_eq!(r.mmio_read(regs::WAKER), Ok(0));
        assert_eq!(
            r.mmio_write(regs::TYPER, 0, &t, &mut v),
            Err(GicError::ReadOnly(regs::TYPER))
        );
        assert!(r.mmio_read(regs::SETLPIR).is_err(), "write-only");
        assert!(r.mmio_write(regs::CTLR, 2, &t, &mut v).is_err());
    }

    #[test]
    fn vsgis_have_no_active_state() {
        let mut v = VlpiTables::for_params(&GicParams::gicv4_1(2, 4));
        v.configure_vsgi(1, 2, 0x50, Group::G1, true, false)
            .unwrap();
        assert_eq!(v.raise_vsgi(1, 2), Ok(true));
        assert!(v.configure_vsgi(1, 16, 0, Group::G1, true, false).is_err());
        let mut r = Redistributor::new(0, &GicParams::gicv4_1(2, 4));
        r.make_resident(1, &mut v).unwrap();
        let mut d = r.direct_vlpis(&mut v).unwrap();
        assert_eq!(d.best().map(|c| c.intid), Some(2));
        assert!(d.acknowledge(2));
        assert_eq!(d.best(), None, "acknowledged: no longer pending");
        assert!(!v.vsgi_pending(1, 2));
        // Without an active state a second vSGI of the same INTID is
        // pending again at once (nASSGIreq semantics).
        assert_eq!(v.raise_vsgi(1, 2), Ok(true));
        assert!(v.vsgi_pending(1, 2));
    }

    #[test]
    fn the_v41_doorbell_is_wanted_only_after_a_deschedule_that_asks_for_it() {
        let p = GicParams::gicv4_1(2, 4);
        let mut v = VlpiTables::for_params(&p);
        let mut r = Redistributor::new(0, &p);
        r.make_resident(1, &mut v).unwrap();
        assert!(!v.doorbell_wanted(1), "resident: no doorbell");
        r.make_non_resident(&mut v, false).unwrap();
        assert!(!v.doorbell_wanted(1), "preempted: Doorbell = 0");
        r.make_resident(1, &mut v).unwrap();
        let t = LpiConfigTable::new(64);
        r.mmio_write(regs::VPENDBASER, VPENDBASER_DOORBELL, &t, &mut v)
            .unwrap();
        assert_eq!(r.resident(), None);
        assert!(v.doorbell_wanted(1), "blocked in WFI: Doorbell = 1");
    }
}
