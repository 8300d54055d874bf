//! VT-d interrupt remapping (Intel VT-d specification, ch. 5 "Interrupt
//! Remapping").
//!
//! A device's remappable-format MSI carries only a handle; the IOMMU looks the
//! handle up in the interrupt-remapping table (IRT), checks the requester id
//! against the entry's source-id fields, and sends the interrupt the entry
//! describes. Schemes that retarget device interrupts (to another core, or to
//! a posted vector) do so by rewriting IRTEs, and each rewrite must be followed
//! by an interrupt-entry-cache invalidation: the model counts both so their
//! cost can be charged.

use crate::hw::x86::lapic::DeliveryMode;

/// Largest IRT the architecture allows: 2^16 entries, what a 16-bit handle indexes.
pub const MAX_IRT_ENTRIES: usize = 1 << 16;

/// The vector an NMI is delivered with, whatever the entry's vector field says.
const NMI_VECTOR: u8 = 2;

/// Source-id verification (SVT/SQ/SID fields collapsed): whether the requester id must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceCheck {
    /// SVT = 00: any requester may use the entry.
    None,
    /// SVT = 01, SQ = 00: only this exact requester id (bus/device/function).
    RequesterId(u16),
}

/// A remappable-format interrupt-remapping table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Irte {
    /// P: the entry is valid; remapping through a clear one faults.
    pub present: bool,
    /// The x2APIC id the interrupt is sent to.
    pub dest_apic_id: u32,
    /// The vector sent (ignored for NMI delivery).
    pub vector: u8,
    /// How the destination takes the interrupt.
    pub mode: DeliveryMode,
    /// TM: level-triggered, so its EOI must reach the source.
    pub level_triggered: bool,
    /// Who may use this entry.
    pub source_check: SourceCheck,
}

impl Irte {
    /// The state of every entry of a fresh table: not present.
    pub const NOT_PRESENT: Irte = Irte {
        present: false,
        dest_apic_id: 0,
        vector: 0,
        mode: DeliveryMode::Fixed,
        level_triggered: false,
        source_check: SourceCheck::None,
    };

    /// A present, edge-triggered fixed entry for `vector` at `dest_apic_id`
    /// with no source check: the common case when setting up an MSI.
    pub fn fixed(dest_apic_id: u32, vector: u8) -> Self {
        Irte {
            present: true,
            dest_apic_id,
            vector,
            ..Irte::NOT_PRESENT
        }
    }
}

/// What remapping an MSI produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remapped {
    /// Remappable format: an interrupt for a LAPIC.
    Interrupt(RemappedInterrupt),
    /// Posted format: post `vector` to posted-interrupt descriptor
    /// `descriptor` (and notify per its ON/SN/NV/NDST).
    Posted {
        /// Descriptor index.
        descriptor: u16,
        /// Vector to post.
        vector: u8,
    },
    /// AMD GuestMode format (guest virtual APIC): the entry itself says
    /// what to do (`iommu_ga::deliver`).
    GuestMode(super::iommu_ga::GaIrte),
}

/// A remappable-format MSI as a device emits it: the handle that indexes the IRT and the device's requester id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemappableMsi {
    /// The IRT index (the subhandle, if any, already added in).
    pub handle: u16,
    /// The bus/device/function of the device that wrote the MSI.
    pub requester_id: u16,
}

/// Result of remapping: what the LAPIC at `dest_apic_id` receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemappedInterrupt {
    /// The x2APIC id of the destination core.
    pub dest_apic_id: u32,
    /// The vector; 2 for NMIs.
    pub vector: u8,
    /// How the destination takes it.
    pub mode: DeliveryMode,
}

/// An interrupt-remapping fault: the interrupt is blocked and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RemapFault {
    /// The handle indexes past the end of the table.
    #[error("IRT index {0} is beyond the table")]
    OutOfRange(u16),
    /// The entry's present bit is clear.
    #[error("IRT entry {0} is not present")]
    NotPresent(u16),
    /// The requester is not the one the entry admits.
    #[error("requester id {got:#06x} does not match IRT entry {index} (expects {want:#06x})")]
    SourceIdMismatch {
        /// The entry looked up.
        index: u16,
        /// The requester id the MSI carried.
        got: u16,
        /// The requester id the entry admits.
        want: u16,
    },
}

/// Event counts of one interrupt-remapping table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrtCounters {
    /// Interrupts remapped successfully.
    pub remaps: u64,
    /// Interrupts blocked by a remapping fault.
    pub faults: u64,
    /// IRTE writes.
    pub writes: u64,
    /// Interrupt-entry-cache invalidations (per entry or global).
    pub invalidations: u64,
    /// Lookups (faulting or not) of an entry written but not yet invalidated.
    pub stale_remaps: u64,
}

/// The interrupt-remapping table and its interrupt-entry cache bookkeeping.
#[derive(Clone, Debug)]
pub struct InterruptRemappingTable {
    entries: Vec<Irte>,
    /// Per entry: `Some(descriptor)` when the entry is in posted format
    /// (VT-d posted interrupts): a matching MSI is posted to that
    /// posted-interrupt descriptor with the entry's vector.
    posted: Vec<Option<u16>>,
    /// Per entry: the GuestMode entry when the entry is in that format
    /// (an AMD IOMMU with guest virtual APIC).
    guest_mode: Vec<Option<super::iommu_ga::GaIrte>>,
    /// Entries written since their last invalidation.
    uninvalidated: Vec<bool>,
    /// Per entry: interrupts it delivered in NMI mode (see [`Self::nmi_deliveries`]).
    nmi_deliveries: Vec<u64>,
    counters: IrtCounters,
}

impl InterruptRemappingTable {
    /// A table of `entries` not-present entries, at most [`MAX_IRT_ENTRIES`]
    /// (larger requests are cut to that, as a 16-bit handle can index no more).
    pub fn new(entries: usize) -> Self {
        let n = entries.min(MAX_IRT_ENTRIES);
        InterruptRemappingTable {
            entries: vec![Irte::NOT_PRESENT; n],
            posted: vec![None; n],
            guest_mode: vec![None; n],
            uninvalidated: vec![false; n],
            nmi_deliveries: vec![0; n],
            counters: IrtCounters::default(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entries (every remap faults).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `index`, if the table reaches that far.
    pub fn get(&self, index: u16) -> Option<&Irte> {
        self.entries.get(usize::from(index))
    }

    /// Whether entry `index` was written and not invalidated since.
    pub fn needs_invalidation(&self, index: u16) -> bool {
        self.uninvalidated
            .get(usize::from(index))
            .copied()
            .unwrap_or(false)
    }

    /// Writes an entry. Real hardware caches entries (the interrupt-entry cache), so software must invalidate after a write; the model counts writes and invalidations so a scheme's cost can be charged, and serves remaps from the table (the cache is modelled as always coherent after `invalidate`; a remap of an entry written but not yet invalidated is counted as `stale_remaps` but still uses the new value).
    pub fn write(&mut self, index: u16, irte: Irte) -> Result<(), RemapFault> {
        let i = usize::from(index);
        let slot = self
            .entries
            .get_mut(i)
            .ok_or(RemapFault::OutOfRange(index))?;
        *slot = irte;
        self.posted[i] = None;
        self.guest_mode[i] = None;
        self.uninvalidated[i] = true;
        self.counters.writes += 1;
        Ok(())
    }

    /// Writes a posted-format entry: MSIs that pass the entry's checks are
    /// posted to descriptor `descriptor` with `irte.vector` (destination and
    /// mode then come from the descriptor's NDST and NV).
    pub fn write_posted(
        &mut self,
        index: u16,
        irte: Irte,
        descriptor: u16,
    ) -> Result<(), RemapFault> {
        self.write(index, irte)?;
        self.posted[usize::from(index)] = Some(descriptor);
        Ok(())
    }

    /// Writes a GuestMode entry (AMD guest virtual APIC): MSIs that pass
    /// `irte`'s checks are delivered as `ga` says.
    pub fn write_guest_mode(
        &mut self,
        index: u16,
        irte: Irte,
        ga: super::iommu_ga::GaIrte,
    ) -> Result<(), RemapFault> {
        self.write(index, irte)?;
        self.guest_mode[usize::from(index)] = Some(ga);
        Ok(())
    }

    /// The GuestMode entry at `index`, if the entry is in that format.
    pub fn guest_mode(&self, index: u16) -> Option<&super::iommu_ga::GaIrte> {
        self.guest_mode
            .get(usize::from(index))
            .and_then(|g| g.as_ref())
    }

    /// `amd_iommu_update_ga`: rewrites a GuestMode entry's IsRun and
    /// destination in place (an IRTE update, counted as a write).
    pub fn update_ga(&mut self, index: u16, is_run: bool, destination: u32) {
        if let Some(Some(g)) = self.guest_mode.get_mut(usize::from(index)) {
            g.is_run = is_run;
            g.destination = destination;
            self.uninvalidated[usize::from(index)] = true;
            self.counters.writes += 1;
        }
    }

    /// The posted-interrupt descriptor a posted-format entry names, if the
    /// entry is in that format.
    pub fn posted_descriptor(&self, index: u16) -> Option<u16> {
        self.posted.get(usize::from(index)).copied().flatten()
    }

    /// Remaps an MSI through an entry of either format.
    pub fn remap_any(&mut self, msi: RemappableMsi) -> Result<Remapped, RemapFault> {
        let r = self.remap(msi)?;
        if let Some(ga) = self.guest_mode(msi.handle) {
            return Ok(Remapped::GuestMode(*ga));
        }
        Ok(
            match self.posted.get(usize::from(msi.handle)).copied().flatten() {
                Some(descriptor) => Remapped::Posted {
                    descriptor,
                    vector: r.vector,
                },
                None => Remapped::Interrupt(r),
            },
        )
    }

    /// Invalidates the interrupt-entry cache for `index`. An index past the
    /// table is harmless to hardware (nothing is cached there) but the
    /// invalidation is still issued and counted.
    pub fn invalidate(&mut self, index: u16) {
        if let Some(flag) = self.uninvalidated.get_mut(usize::from(index)) {
            *flag = false;
        }
        self.counters.invalidations += 1;
    }

    /// Global interrupt-entry-cache invalidation: one operation covering
    /// every entry.
    pub fn invalidate_all(&mut self) {
        self.uninvalidated.iter_mut().for_each(|f| *f = false);
        self.counters.invalidations += 1;
    }

    /// Remaps an MSI through its entry; a fault blocks the interrupt and is
    /// counted. NMI entries deliver vector 2 whatever their vector field says.
    pub fn remap(&mut self, msi: RemappableMsi) -> Result<RemappedInterrupt, RemapFault> {
        let r = self.lookup(msi);
        match r {
            Ok(_) => self.counters.remaps += 1,
            Err(_) => self.counters.faults += 1,
        }
        r
    }

    fn lookup(&mut self, msi: RemappableMsi) -> Result<RemappedInterrupt, RemapFault> {
        let index = msi.handle;
        let i = usize::from(index);
        let irte = *self.entries.get(i).ok_or(RemapFault::OutOfRange(index))?;
        if self.uninvalidated[i] {
            self.counters.stale_remaps += 1;
        }
        if !irte.present {
            return Err(RemapFault::NotPresent(index));
        }
        if let SourceCheck::RequesterId(want) = irte.source_check {
            if msi.requester_id != want {
                return Err(RemapFault::SourceIdMismatch {
                    index,
                    got: msi.requester_id,
                    want,
                });
            }
        }
        let vector = if irte.mode == DeliveryMode::Nmi {
            self.nmi_deliveries[i] += 1;
            NMI_VECTOR
        } else {
            irte.vector
        };
        Ok(RemappedInterrupt {
            dest_apic_id: irte.dest_apic_id,
            vector,
            mode: irte.mode,
        })
    }

    /// How many interrupts entry `index` has delivered in NMI mode.
    ///
    /// Not a VT-d register: an NMI carries no vector, so a hypervisor that
    /// aims a device at a core in NMI mode (DID §4.2) must find the source
    /// some other way (a real one polls the devices' interrupt-cause
    /// registers). The model gives it the count per entry, which is exact
    /// whatever is in flight when the entry is rewritten: a message
    /// remapped after the rewrite is counted here, one remapped before
    /// arrived in the old mode.
    pub fn nmi_deliveries(&self, index: u16) -> u64 {
        self.nmi_deliveries
            .get(usize::from(index))
            .copied()
            .unwrap_or(0)
    }

    /// The event counts so far.
    pub fn counters(&self) -> IrtCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posted_format_entries_post_and_a_rewrite_makes_them_remappable_again() {
        let mut t = InterruptRemappingTable::new(4);
        let msi = RemappableMsi {
            handle: 1,
            requester_id: 7,
        };
        let mut e = Irte::fixed(3, 0x41);
        e.source_check = SourceCheck::RequesterId(7);
        t.write_posted(1, e, 5).unwrap();
        assert_eq!(
            t.remap_any(msi),
            Ok(Remapped::Posted {
                descriptor: 5,
                vector: 0x41
            })
        );
        // A posted entry still checks the requester id.
        assert!(t
            .remap_any(RemappableMsi {
                handle: 1,
                requester_id: 8
            })
            .is_err());
        t.write(1, e).unwrap();
        assert!(matches!(t.remap_any(msi), Ok(Remapped::Interrupt(r)) if r.dest_apic_id == 3));
    }
    #[test]
    fn nmi_deliveries_count_only_messages_remapped_in_nmi_mode() {
        let mut t = InterruptRemappingTable::new(2);
        let m = RemappableMsi {
            handle: 0,
            requester_id: 1,
        };
        t.write(0, Irte::fixed(1, 0x41)).unwrap();
        t.remap(m).unwrap();
        assert_eq!(t.nmi_deliveries(0), 0);
        t.write(
            0,
            Irte {
                mode: DeliveryMode::Nmi,
                ..Irte::fixed(1, 0x41)
            },
        )
        .unwrap();
        assert_eq!(t.remap(m).unwrap().vector, NMI_VECTOR);
        assert_eq!(t.nmi_deliveries(0), 1);
        // A rewrite back to fixed mode keeps the count: the NMI may still
        // be waiting for its handler.
        t.write(0, Irte::fixed(1, 0x41)).unwrap();
        t.remap(m).unwrap();
        assert_eq!(t.nmi_deliveries(0), 1);
        assert_eq!(t.nmi_deliveries(9), 0);
    }
    use proptest::prelude::*;

    fn msi(handle: u16, requester_id: u16) -> RemappableMsi {
        RemappableMsi {
            handle,
            requester_id,
        }
    }

    #[test]
    fn fresh_table_faults_not_present() {
        let mut t = InterruptRemappingTable::new(8);
        assert_eq!(t.len(), 8);
        assert!(!t.is_empty());
        assert_eq!(t.get(7), Some(&Irte::NOT_PRESENT));
        assert_eq!(t.remap(msi(0, 0x100)), Err(RemapFault::NotPresent(0)));
        let c = t.counters();
        assert_eq!((c.remaps, c.faults, c.stale_remaps), (0, 1, 0));
    }

    #[test]
    fn out_of_range_handles_fault() {
        let mut t = InterruptRemappingTable::new(4);
        assert_eq!(t.get(4), None);
        assert_eq!(
            t.write(4, Irte::fixed(0, 0x40)),
            Err(RemapFault::OutOfRange(4))
        );
        assert_eq!(t.remap(msi(4, 0)), Err(RemapFault::OutOfRange(4)));
        assert_eq!(
            t.remap(msi(u16::MAX, 0)),
            Err(RemapFault::OutOfRange(u16::MAX))
        );
        assert_eq!(t.counters().faults, 2);
        assert_eq!(t.counters().writes, 0);
        let mut empty = InterruptRemappingTable::new(0);
        assert!(empty.is_empty());
        assert_eq!(empty.remap(msi(0, 0)), Err(RemapFault::OutOfRange(0)));
    }

    #[test]
    fn table_size_is_capped_at_what_a_handle_indexes() {
        let mut t = InterruptRemappingTable::new(usize::MAX);
        assert_eq!(t.len(), MAX_IRT_ENTRIES);
        assert_eq!(t.write(u16::MAX, Irte::fixed(9, 0x41)), Ok(()));
        assert_eq!(t.remap(msi(u16::MAX, 0)).map(|r| r.vector), Ok(0x41));
    }

    #[test]
    fn present_entry_remaps_to_its_destination() {
        let mut t = InterruptRemappingTable::new(16);
        let e = Irte {
            mode: DeliveryMode::LowestPriority,
            ..Irte::fixed(0x1_0005, 0x61)
        };
        assert_eq!(t.write(3, e), Ok(()));
        assert_eq!(t.get(3), Some(&e));
        assert_eq!(
            t.remap(msi(3, 0x0300)),
            Ok(RemappedInterrupt {
                dest_apic_id: 0x1_0005,
                vector: 0x61,
                mode: DeliveryMode::LowestPriority
            })
        );
        assert_eq!(t.counters().remaps, 1);
    }

    #[test]
    fn uninvalidated_entry_counts_as_stale_but_uses_new_value() {
        let mut t = InterruptRemappingTable::new(4);
        t.write(1, Irte::fixed(0, 0x40)).ok();
        t.invalidate(1);
        t.write(1, Irte::fixed(2, 0x50)).ok();
        assert!(t.needs_invalidation(1));
        let r = t.remap(msi(1, 0));
        assert_eq!(r.map(|r| (r.dest_apic_id, r.vector)), Ok((2, 0x50)));
        assert_eq!(t.counters().stale_remaps, 1);
        t.invalidate(1);
        assert!(!t.needs_invalidation(1));
        t.remap(msi(1, 0)).ok();
        // Entry 0 was never written: not stale, just not present.
        t.remap(msi(0, 0)).ok();
        let c = t.counters();
        assert_eq!(
            (
                c.writes,
                c.invalidations,
                c.stale_remaps,
                c.remaps,
                c.faults
            ),
            (2, 2, 1, 2, 1)
        );
    }

    #[test]
    fn global_invalidation_clears_every_entry() {
        let mut t = InterruptRemappingTable::new(4);
        for i in 0..4 {
            t.write(i, Irte::fixed(0, 0x40)).ok();
        }
        t.invalidate(99);
        assert!((0..4).all(|i| t.needs_invalidation(i)));
        t.invalidate_all();
        assert!((0..4).all(|i| !t.needs_invalidation(i)));
        assert_eq!(t.counters().invalidations, 2);
    }

    #[test]
    fn source_id_is_verified() {
        let mut t = InterruptRemappingTable::new(4);
        let e = Irte {
            source_check: SourceCheck::RequesterId(0x0310),
            ..Irte::fixed(1, 0x70)
        };
        t.write(2, e).ok();
        t.invalidate(2);
        assert_eq!(
            t.remap(msi(2, 0x0311)),
            Err(RemapFault::SourceIdMismatch {
                index: 2,
                got: 0x0311,
                want: 0x0310
            })
        );
        assert_eq!(t.remap(msi(2, 0x0310)).map(|r| r.vector), Ok(0x70));
        assert_eq!((t.counters().faults, t.counters().remaps), (1, 1));
        let msg = RemapFault::SourceIdMismatch {
            index: 2,
            got: 0x311,
            want: 0x310,
        }
        .to_string();
        assert_eq!(
            msg,
            "requester id 0x0311 does not match IRT entry 2 (expects 0x0310)"
        );
    }

    #[test]
    fn not_present_entry_faults_before_source_check() {
        let mut t = InterruptRemappingTable::new(4);
        let e = Irte {
            present: false,
            source_check: SourceCheck::RequesterId(1),
            ..Irte::fixed(1, 0x70)
        };
        t.write(0, e).ok();
        assert_eq!(t.remap(msi(0, 2)), Err(RemapFault::NotPresent(0)));
    }

    #[test]
    fn nmi_entry_delivers_vector_two() {
        let mut t = InterruptRemappingTable::new(4);
        let e = Irte {
            mode: DeliveryMode::Nmi,
            ..Irte::fixed(6, 0xEE)
        };
        t.write(0, e).ok();
        assert_eq!(
            t.remap(msi(0, 0)),
            Ok(RemappedInterrupt {
                dest_apic_id: 6,
                vector: 2,
                mode: DeliveryMode::Nmi
            })
        );
    }

    fn mode() -> impl Strategy<Value = DeliveryMode> {
        prop_oneof![
            Just(DeliveryMode::Fixed),
            Just(DeliveryMode::LowestPriority),
            Just(DeliveryMode::Nmi)
        ]
    }

    proptest! {
        /// A remap either faults for exactly the architectural reason or
        /// delivers the entry's destination, mode and (non-NMI) vector; every
        /// attempt is counted once as a remap or a fault.
        #[test]
        fn remap_follows_the_entry(
            size in 0usize..32, index in 0u16..40, present in any::<bool>(),
            dest in any::<u32>(), vector in any::<u8>(), mode in mode(),
            want in proptest::option::of(any::<u16>()), rid in any::<u16>(),
        ) {
            let mut t = InterruptRemappingTable::new(size);
            let source_check = want.map_or(SourceCheck::None, SourceCheck::RequesterId);
            let e = Irte { present, dest_apic_id: dest, vector, mode, level_triggered: false, source_check };
            let written = t.write(index, e);
            prop_assert_eq!(written.is_ok(), usize::from(index) < size);
            let r = t.remap(RemappableMsi { handle: index, requester_id: rid });
            let expect = if usize::from(index) >= size {
                Err(RemapFault::OutOfRange(index))
            } else if !present {
                Err(RemapFault::NotPresent(index))
            } else if want.is_some_and(|w| w != rid) {
                Err(RemapFault::SourceIdMismatch { index, got: rid, want: want.unwrap_or(0) })
            } else {
                let vector = if mode == DeliveryMode::Nmi { 2 } else { vector };
                Ok(RemappedInterrupt { dest_apic_id: dest, vector, mode })
            };
            prop_assert_eq!(r, expect);
            let c = t.counters();
            prop_assert_eq!(c.remaps + c.faults, 1);
            prop_assert_eq!(c.stale_remaps, u64::from(written.is_ok()));
        }
    }
}
