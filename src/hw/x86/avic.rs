//! AMD's Advanced Virtual Interrupt Controller (AMD64 APM vol. 2 §15.29,
//! docs/amd.md): the per-vCPU guest APIC backing page, the per-VM physical
//! and logical APIC ID tables, the processor's handling of a guest ICR
//! write (IRR set in the targets' backing pages, a doorbell to the core of
//! each running target, AVIC_INCOMPLETE_IPI otherwise), which APIC
//! register accesses it accelerates, traps or faults, and the doorbell's
//! effect. x2AVIC (Zen 4) extends the same to x2APIC MSR accesses, with a
//! larger physical table and no logical table. The hypervisor only writes
//! table entries and VMCB fields; all of this is the processor's.

use super::lapic::{ApicBitmap, DeliveryMode};
use crate::engine::Time;

/// Largest physical APIC ID table index in xAVIC mode: 0xFE (0xFF is the
/// xAPIC broadcast ID), so 255 entries (Linux `AVIC_MAX_PHYSICAL_ID`).
pub const XAVIC_MAX_PHYSICAL_ID: u32 = 0xFE;
/// Largest index in x2AVIC mode: 0x1FF, so 512 entries (Linux
/// `X2AVIC_MAX_PHYSICAL_ID`).
pub const X2AVIC_MAX_PHYSICAL_ID: u32 = 0x1FF;
/// Entries of the logical APIC ID table (flat: 8, cluster: 15 clusters of
/// 4; one 4 KB page of 32-bit entries).
pub const LOGICAL_ID_ENTRIES: usize = 64;
/// The AVIC doorbell MSR (APM 15.29.4.4): writing a host physical APIC
/// ID to it signals that core's AVIC.
pub const AVIC_DOORBELL_MSR: u32 = 0xC001_011B;

/// Which guest APIC interface the AVIC virtualizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AvicMode {
    /// xAVIC: the xAPIC MMIO page only; an x2APIC guest's MSR accesses
    /// are not virtualized.
    XAvic,
    /// x2AVIC (Zen 4 and later): x2APIC MSR accesses as well.
    #[default]
    X2Avic,
}

impl AvicMode {
    /// The largest physical APIC ID table index.
    pub fn max_physical_id(self) -> u32 {
        match self {
            AvicMode::XAvic => XAVIC_MAX_PHYSICAL_ID,
            AvicMode::X2Avic => X2AVIC_MAX_PHYSICAL_ID,
        }
    }
}

/// The registers of a guest APIC backing page the interrupt path reads
/// (KVM's `apic->regs`, which the AVIC uses in place).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackingPage {
    /// IRR (offset 0x200).
    pub irr: ApicBitmap,
    /// ISR (offset 0x100).
    pub isr: ApicBitmap,
    /// TPR (offset 0x80).
    pub tpr: u8,
}

impl BackingPage {
    /// PPR as the LAPIC computes it (TPR, or ISR's class if higher).
    pub fn ppr(&self) -> u8 {
        let isrv = self.isr.highest().unwrap_or(0);
        if self.tpr >> 4 >= isrv >> 4 {
            self.tpr
        } else {
            isrv & 0xF0
        }
    }

    /// The vector the AVIC would deliver now: the highest IRR above PPR.
    pub fn deliverable(&self) -> Option<u8> {
        let v = self.irr.highest()?;
        (v >> 4 > self.ppr() >> 4).then_some(v)
    }

    /// Delivery to the guest (APM 15.29.2.2): IRR to ISR.
    pub fn deliver(&mut self) -> Option<u8> {
        let v = self.deliverable()?;
        self.irr.clear(v);
        self.isr.set(v);
        Some(v)
    }

    /// An accelerated EOI write: clears the highest ISR bit.
    pub fn eoi(&mut self) -> Option<u8> {
        let v = self.isr.highest()?;
        self.isr.clear(v);
        Some(v)
    }
}

/// One physical APIC ID table entry (64 bits: host physical APIC ID,
/// backing page pointer, IsRunning, Valid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhysicalIdEntry {
    /// V: the entry names a vCPU.
    pub valid: bool,
    /// IsRunning: the vCPU is loaded on `host_apic_id`'s core.
    pub is_running: bool,
    /// The host physical APIC ID a doorbell for it goes to.
    pub host_apic_id: u32,
    /// The backing page (the vCPU's index in the machine); None: the
    /// pointer is not valid.
    pub backing_page: Option<usize>,
    /// When IsRunning was last cleared (what a processor with erratum
    /// 1235 may not yet observe).
    pub cleared_at: Option<Time>,
}

/// One logical APIC ID table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogicalIdEntry {
    /// V.
    pub valid: bool,
    /// The guest physical APIC ID it maps to.
    pub guest_physical_id: u32,
}

/// A VM's AVIC tables (the pages AVIC_PHYSICAL_TABLE and
/// AVIC_LOGICAL_TABLE point at).
#[derive(Clone, Debug)]
pub struct AvicTables {
    /// The mode, which sets the physical table's size.
    pub mode: AvicMode,
    /// The physical APIC ID table, indexed by guest physical APIC ID.
    pub physical: Vec<PhysicalIdEntry>,
    /// The logical APIC ID table (xAVIC only).
    pub logical: Vec<LogicalIdEntry>,
    /// The guest's DFR is flat (else cluster).
    pub dfr_flat: bool,
}

/// How the AVIC takes an access to a guest APIC register (APM table
/// 15-22; Linux `is_avic_unaccelerated_access_trap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// Done in the backing page, no exit.
    Accelerated,
    /// Done in the backing page, then AVIC_UNACCELERATED_ACCESS (trap).
    Trap,
    /// AVIC_UNACCELERATED_ACCESS before the access (fault): the hypervisor
    /// emulates the instruction.
    Fault,
}

/// Register offsets in the APIC page.
pub mod reg {
    #![allow(missing_docs)]
    pub const ID: u16 = 0x20;
    pub const TPR: u16 = 0x80;
    pub const EOI: u16 = 0xB0;
    pub const RRR: u16 = 0xC0;
    pub const LDR: u16 = 0xD0;
    pub const DFR: u16 = 0xE0;
    pub const SPIV: u16 = 0xF0;
    pub const ESR: u16 = 0x280;
    pub const ICR: u16 = 0x300;
    pub const ICR2: u16 = 0x310;
    pub const LVTT: u16 = 0x320;
    pub const LVTTHMR: u16 = 0x330;
    pub const LVTPC: u16 = 0x340;
    pub const LVT0: u16 = 0x350;
    pub const LVT1: u16 = 0x360;
    pub const LVTERR: u16 = 0x370;
    pub const TMICT: u16 = 0x380;
    pub const TMCCT: u16 = 0x390;
    pub const TDCR: u16 = 0x3E0;
}

/// The AVIC's handling of an access to register `offset` (an x2APIC MSR
/// `0x800 + offset/16` in x2AVIC mode). TPR, EOI (of an edge-triggered
/// vector) and ICR are accelerated (an ICR write goes through
/// [`AvicTables::icr_write`]); the APIC ID, LDR, DFR, SPIV, ESR, the LVT
/// entries and the timer's initial count and divider trap after the
/// write: the LAPIC timer is not accelerated. Every other write faults,
/// and of the reads only the timer's current count does.
pub fn access_kind(offset: u16, write: bool, eoi_level_triggered: bool) -> AccessKind {
    use reg::*;
    if !write {
        return if offset == TMCCT {
            AccessKind::Fault
        } else {
            AccessKind::Accelerated
        };
    }
    match offset {
        TPR | ICR | ICR2 => AccessKind::Accelerated,
        EOI if !eoi_level_triggered => AccessKind::Accelerated,
        ID | EOI | RRR | LDR | DFR | SPIV | ESR | LVTT | LVTTHMR | LVTPC | LVT0 | LVT1 | LVTERR
        | TMICT | TDCR => AccessKind::Trap,
        _ => AccessKind::Fault,
    }
}

/// An ICR write the AVIC stopped on: the AVIC_INCOMPLETE_IPI exit's cause
/// and table index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incomplete {
    /// EXITINFO2[63:32].
    pub cause: super::vmcb::IncompleteIpiCause,
    /// EXITINFO2[8:0].
    pub index: u32,
}

/// A guest ICR write as the AVIC reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrWrite {
    /// Vector (bits 7:0).
    pub vector: u8,
    /// Delivery mode (bits 10:8).
    pub mode: DeliveryMode,
    /// Logical destination mode (bit 11).
    pub logical: bool,
    /// Level-triggered (bit 15).
    pub level: bool,
    /// Shorthand (bits 19:18): 0 none, 1 self, 2 all incl. self, 3 all
    /// excl. self.
    pub shorthand: u8,
    /// Destination (x2APIC: bits 63:32; xAPIC: 63:56).
    pub dest: u32,
}

impl IcrWrite {
    /// Decodes an x2APIC ICR value (x2AVIC) or an xAPIC ICR2:ICR pair.
    pub fn decode(icr: u64, x2apic: bool) -> Self {
        let mode = match (icr >> 8) & 7 {
            0 => DeliveryMode::Fixed,
            1 => DeliveryMode::LowestPriority,
            4 => DeliveryMode::Nmi,
            // SMI, INIT, SIPI, reserved: none the AVIC delivers.
            _ => DeliveryMode::Nmi,
        };
        IcrWrite {
            vector: icr as u8,
            mode,
            logical: (icr >> 11) & 1 == 1,
            level: (icr >> 15) & 1 == 1,
            shorthand: ((icr >> 18) & 3) as u8,
            dest: if x2apic {
                (icr >> 32) as u32
            } else {
                (icr >> 56) as u32
            },
        }
    }
}

/// The processor's erratum 1235 (AMD family 17h revision guide: "guest
/// with AVIC enabled may fail to process IPI until guest is
/// re-scheduled"): a sender's ICR processing may still see IsRunning set
/// for `window` after it was cleared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Erratum1235 {
    /// How long after a clear the stale IsRunning may be observed; None:
    /// the processor does not have the erratum.
    pub window: Option<Time>,
}

impl AvicTables {
    /// Empty tables for `mode`: every physical entry invalid, the logical
    /// table only in xAVIC mode.
    pub fn new(mode: AvicMode) -> Self {
        AvicTables {
            mode,
            physical: vec![PhysicalIdEntry::default(); mode.max_physical_id() as usize + 1],
            logical: match mode {
                AvicMode::XAvic => vec![LogicalIdEntry::default(); LOGICAL_ID_ENTRIES],
                AvicMode::X2Avic => Vec::new(),
            },
            dfr_flat: true,
        }
    }

    /// The logical table index of logical APIC ID `ldr_id` (LDR[31:24]),
    /// flat (one bit of 8) or cluster (cluster in bits 7:4, one bit of 4
    /// in bits 3:0), as Linux's `avic_get_logical_id_entry` computes it.
    pub fn logical_index(&self, ldr_id: u8, flat: bool) -> Option<usize> {
        if ldr_id == 0 {
            return None;
        }
        if flat {
            Some(ldr_id.trailing_zeros() as usize)
        } else {
            let cluster = (ldr_id >> 4) as usize;
            let bits = ldr_id & 0xF;
            if bits == 0 || cluster >= 0xF {
                return None;
            }
            Some((cluster << 2) + bits.trailing_zeros() as usize)
        }
    }

    /// Whether the processor sees `entry`'s target as running at `now`.
    fn observed_running(e: &PhysicalIdEntry, now: Time, erratum: Erratum1235) -> bool {
        e.is_running
            || match (erratum.window, e.cleared_at) {
                (Some(w), Some(t)) => now < t + w,
                _ => false,
            }
    }

    /// The guest physical APIC IDs an ICR write names, in table order,
    /// or where the lookup stopped. `sender` is the sender's own ID.
    fn targets(
        &self,
        icr: &IcrWrite,
        sender: u32,
        mut each: impl FnMut(u32),
    ) -> Result<(), Incomplete> {
        use super::vmcb::IncompleteIpiCause::InvalidTarget;
        let valid = |i: u32| self.physical.get(i as usize).is_some_and(|e| e.valid);
        let broadcast = match self.mode {
            AvicMode::XAvic => 0xFF,
            AvicMode::X2Avic => u32::MAX,
        };
        match icr.shorthand {
            1 => each(sender),
            2 | 3 => {
                for i in 0..self.physical.len() as u32 {
                    if valid(i) && (icr.shorthand == 2 || i != sender) {
                        each(i);
                    }
                }
            }
            _ if icr.dest == broadcast => {
                for i in 0..self.physical.len() as u32 {
                    if valid(i) {
                        each(i);
                    }
                }
            }
            _ if !icr.logical => {
                if !valid(icr.dest) {
                    return Err(Incomplete {
                        cause: InvalidTarget,
                        index: icr.dest,
                    });
                }
                each(icr.dest);
            }
            _ => {
                // x2AVIC: a logical x2APIC destination is cluster (31:16)
                // and a 16-bit mask; the IDs follow from it (no table).
                if self.mode == AvicMode::X2Avic {
                    let cluster = icr.dest >> 16;
                    for b in 0..16 {
                        if icr.dest >> b & 1 == 1 {
                            let id = (cluster << 4) | b;
                            if !valid(id) {
                                return Err(Incomplete {
                                    cause: InvalidTarget,
                                    index: id,
                                });
                            }
                            each(id);
                        }
                    }
                    return Ok(());
                }
                let dl = icr.dest as u8;
                let bits: u8 = if self.dfr_flat { dl } else { dl & 0xF };
                for b in 0..8 {
                    if bits >> b & 1 == 0 {
                        continue;
                    }
                    let id = if self.dfr_flat {
                        1u8 << b
                    } else {
                        (dl & 0xF0) | (1u8 << b)
                    };
                    let i = self.logical_index(id, self.dfr_flat);
                    match i.and_then(|i| self.logical.get(i)) {
                        Some(e) if e.valid => each(e.guest_physical_id),
                        _ => {
                            return Err(Incomplete {
                                cause: InvalidTarget,
                                index: i.unwrap_or(0) as u32,
                            })
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The processor's handling of a guest ICR write from the vCPU with
    /// guest physical APIC ID `sender` (APM 15.29.4.3): a fixed,
    /// edge-triggered IPI sets the vector in each target's backing page
    /// IRR and rings `doorbell(host APIC ID)` for each target it sees
    /// running (other than the sender itself, which evaluates its own
    /// page); any target not running makes the write end in
    /// AVIC_INCOMPLETE_IPI (target not running), after the IRR bits are
    /// set. A non-fixed or level IPI, an invalid entry or backing page
    /// ends it with the matching cause.
    pub fn icr_write(
        &self,
        pages: &mut [BackingPage],
        sender: u32,
        icr: IcrWrite,
        now: Time,
        erratum: Erratum1235,
        mut doorbell: impl FnMut(u32),
    ) -> Result<(), Incomplete> {
        use super::vmcb::IncompleteIpiCause::*;
        if icr.mode != DeliveryMode::Fixed || icr.level {
            return Err(Incomplete {
                cause: InvalidIntType,
                index: 0,
            });
        }
        let mut not_running = None;
        let mut bad_page = None;
        self.targets(&icr, sender, |id| {
            let e = self.physical[id as usize];
            let Some(page) = e.backing_page.and_then(|p| pages.get_mut(p)) else {
                bad_page.get_or_insert(id);
                return;
            };
            page.irr.set(icr.vector);
            if id == sender {
                return;
            }
            if Self::observed_running(&e, now, erratum) {
                doorbell(e.host_apic_id);
            } else {
                not_running.get_or_insert(id);
            }
        })?;
        if let Some(index) = bad_page {
            return Err(Incomplete {
                cause: InvalidBackingPage,
                index,
            });
        }
        match not_running {
            Some(index) => Err(Incomplete {
                cause: TargetNotRunning,
                index,
            }),
            None => Ok(()),
        }
    }

    /// `avic_vcpu_load`/`avic_vcpu_put`'s write of a vCPU's entry:
    /// IsRunning and the host physical APIC ID.
    pub fn set_running(&mut self, id: u32, running: bool, host_apic_id: u32, now: Time) {
        if let Some(e) = self.physical.get_mut(id as usize) {
            if e.is_running && !running {
                e.cleared_at = Some(now);
            }
            e.is_running = running;
            e.host_apic_id = host_apic_id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::vmcb::IncompleteIpiCause;
    use super::*;

    fn tables(mode: AvicMode, n: usize) -> (AvicTables, Vec<BackingPage>) {
        let mut t = AvicTables::new(mode);
        for i in 0..n {
            t.physical[i] = PhysicalIdEntry {
                valid: true,
                backing_page: Some(i),
                ..Default::default()
            };
        }
        (t, vec![BackingPage::default(); n])
    }

    fn fixed(dest: u32, vector: u8) -> IcrWrite {
        IcrWrite::decode((u64::from(dest) << 32) | u64::from(vector), true)
    }

    #[test]
    fn the_doorbell_rings_only_for_running_targets() {
        let (mut t, mut pages) = tables(AvicMode::X2Avic, 3);
        t.set_running(1, true, 7, 0);
        let mut rung = Vec::new();
        let r = t.icr_write(
            &mut pages,
            0,
            fixed(1, 0xFD),
            0,
            Erratum1235::default(),
            |c| rung.push(c),
        );
        assert_eq!(r, Ok(()));
        assert_eq!(rung, [7], "the doorbell goes to the target's host APIC ID");
        assert!(pages[1].irr.test(0xFD));
        // Not running: IRR set all the same, no doorbell, an incomplete IPI.
        rung.clear();
        let r = t.icr_write(
            &mut pages,
            0,
            fixed(2, 0xFD),
            0,
            Erratum1235::default(),
            |c| rung.push(c),
        );
        assert_eq!(
            r,
            Err(Incomplete {
                cause: IncompleteIpiCause::TargetNotRunning,
                index: 2
            })
        );
        assert!(rung.is_empty());
        assert!(pages[2].irr.test(0xFD));
        // IsRunning cleared (the vCPU was put): the same.
        t.set_running(1, false, 7, 10);
        let r = t.icr_write(
            &mut pages,
            0,
            fixed(1, 0xFE),
            20,
            Erratum1235::default(),
            |c| rung.push(c),
        );
        assert_eq!(
            r.map_err(|e| e.cause),
            Err(IncompleteIpiCause::TargetNotRunning)
        );
        assert!(rung.is_empty());
    }

    #[test]
    fn with_erratum_1235_a_recent_clear_is_missed_and_nothing_exits() {
        let (mut t, mut pages) = tables(AvicMode::X2Avic, 2);
        t.set_running(1, true, 5, 0);
        t.set_running(1, false, 5, 100);
        let erratum = Erratum1235 { window: Some(50) };
        let mut rung = Vec::new();
        let r = t.icr_write(&mut pages, 0, fixed(1, 0xFD), 120, erratum, |c| {
            rung.push(c)
        });
        assert_eq!(r, Ok(()), "the stale IsRunning: no exit");
        assert_eq!(rung, [5], "a doorbell to a core the vCPU left");
        let r = t.icr_write(&mut pages, 0, fixed(1, 0xFD), 150, erratum, |_| {});
        assert!(r.is_err(), "past the window the clear is seen");
    }

    #[test]
    fn incomplete_ipi_causes() {
        let (mut t, mut pages) = tables(AvicMode::XAvic, 2);
        let none = Erratum1235::default();
        // NMI, INIT, level-triggered: not the AVIC's.
        let nmi = IcrWrite::decode((1 << 32) | (4 << 8), true);
        assert_eq!(
            t.icr_write(&mut pages, 0, nmi, 0, none, |_| {}),
            Err(Incomplete {
                cause: IncompleteIpiCause::InvalidIntType,
                index: 0
            })
        );
        let level = IcrWrite::decode((1 << 32) | (1 << 15) | 0x40, true);
        assert_eq!(
            t.icr_write(&mut pages, 0, level, 0, none, |_| {})
                .map_err(|e| e.cause),
            Err(IncompleteIpiCause::InvalidIntType)
        );
        // An invalid physical entry, or one past the table.
        for dest in [5, 300] {
            assert_eq!(
                t.icr_write(&mut pages, 0, fixed(dest, 0x40), 0, none, |_| {}),
                Err(Incomplete {
                    cause: IncompleteIpiCause::InvalidTarget,
                    index: dest
                })
            );
        }
        // An invalid logical entry (flat: logical ID bit 2 not mapped).
        let logical = IcrWrite::decode((0x04u64 << 56) | (1 << 11) | 0x40, false);
        assert_eq!(
            t.icr_write(&mut pages, 0, logical, 0, none, |_| {})
                .map_err(|e| e.cause),
            Err(IncompleteIpiCause::InvalidTarget)
        );
        // Mapped: delivered to guest physical ID 1 (not running: exit).
        t.logical[2] = LogicalIdEntry {
            valid: true,
            guest_physical_id: 1,
        };
        assert_eq!(
            t.icr_write(&mut pages, 0, logical, 0, none, |_| {})
                .map_err(|e| e.cause),
            Err(IncompleteIpiCause::TargetNotRunning)
        );
        assert!(pages[1].irr.test(0x40));
        // A valid entry whose backing page pointer is not.
        t.physical[1].backing_page = None;
        assert_eq!(
            t.icr_write(&mut pages, 0, fixed(1, 0x41), 0, none, |_| {})
                .map_err(|e| e.cause),
            Err(IncompleteIpiCause::InvalidBackingPage)
        );
    }

    #[test]
    fn the_logical_table_indexes_flat_and_cluster_ids() {
        let t = AvicTables::new(AvicMode::XAvic);
        assert_eq!(t.logical_index(0x01, true), Some(0));
        assert_eq!(t.logical_index(0x80, true), Some(7));
        assert_eq!(t.logical_index(0x00, true), None);
        // Cluster 2, member bit 1.
        assert_eq!(t.logical_index(0x22, false), Some(9));
        assert_eq!(
            t.logical_index(0xF1, false),
            None,
            "cluster 15 is broadcast"
        );
    }

    #[test]
    fn x2avic_tables_are_larger_and_have_no_logical_table() {
        let x = AvicTables::new(AvicMode::XAvic);
        let x2 = AvicTables::new(AvicMode::X2Avic);
        assert_eq!(x.physical.len(), 255);
        assert_eq!(x2.physical.len(), 512);
        assert_eq!(x.logical.len(), LOGICAL_ID_ENTRIES);
        assert!(x2.logical.is_empty());
        // An x2APIC ID above 254 is a valid target only in x2AVIC mode.
        let (t, mut pages) = tables(AvicMode::X2Avic, 400);
        let r = t.icr_write(
            &mut pages,
            0,
            fixed(399, 0x40),
            0,
            Erratum1235::default(),
            |_| {},
        );
        assert_eq!(
            r.map_err(|e| e.cause),
            Err(IncompleteIpiCause::TargetNotRunning)
        );
    }

    #[test]
    fn trap_or_fault_by_register() {
        use reg::*;
        for r in [TMICT, TDCR, LVTT, LDR, DFR, ID, SPIV] {
            assert_eq!(access_kind(r, true, false), AccessKind::Trap, "{r:#x}");
        }
        for r in [TPR, EOI, ICR] {
            assert_eq!(
                access_kind(r, true, false),
                AccessKind::Accelerated,
                "{r:#x}"
            );
        }
        assert_eq!(access_kind(EOI, true, true), AccessKind::Trap);
        assert_eq!(access_kind(TMCCT, false, false), AccessKind::Fault);
        assert_eq!(access_kind(TMCCT, true, false), AccessKind::Fault);
        assert_eq!(access_kind(TMICT, false, false), AccessKind::Accelerated);
    }

    #[test]
    fn the_backing_page_delivers_above_ppr_and_eoi_clears_isr() {
        let mut p = BackingPage::default();
        p.irr.set(0x41);
        p.irr.set(0x35);
        assert_eq!(p.deliver(), Some(0x41));
        assert_eq!(p.deliverable(), None, "0x35 is below the in-service class");
        assert_eq!(p.eoi(), Some(0x41));
        assert_eq!(p.deliver(), Some(0x35));
        p.tpr = 0x50;
        p.irr.set(0x45);
        assert_eq!(p.deliverable(), None);
    }
}
