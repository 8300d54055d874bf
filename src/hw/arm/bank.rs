//! The per-INTID state of a contiguous range of wired interrupts, and the
//! register layout the distributor (SPIs) and each redistributor's SGI_base
//! frame (SGIs and PPIs) share (GICv3 spec §12.9 GICD_* and §12.11 GICR_*:
//! GICR_ISENABLER0 sits at the same offset in SGI_base as `GICD_ISENABLER<n>`
//! in the distributor, and so on for every register below).
//!
//! Pending state follows §4.1.2: an edge-triggered interrupt latches pending
//! on a rising edge (or an ISPENDR write) and the latch clears when it is
//! acknowledged; a level-sensitive one is pending while its line is high or
//! while software has latched it pending. A pending *and* active interrupt is
//! not a candidate for signalling until it is deactivated.

use crate::hw::arm::intid::{Bitmap, GicError};
use crate::hw::arm::priority::{priority_mask, Candidate, Group};

/// GICD/GICR_SGI_base register offsets shared by both frames.
pub mod offsets {
    /// Interrupt group registers (1 = group 1).
    pub const IGROUPR: u64 = 0x0080;
    /// Set-enable registers.
    pub const ISENABLER: u64 = 0x0100;
    /// Clear-enable registers.
    pub const ICENABLER: u64 = 0x0180;
    /// Set-pending registers.
    pub const ISPENDR: u64 = 0x0200;
    /// Clear-pending registers.
    pub const ICPENDR: u64 = 0x0280;
    /// Set-active registers.
    pub const ISACTIVER: u64 = 0x0300;
    /// Clear-active registers.
    pub const ICACTIVER: u64 = 0x0380;
    /// Priority registers, one byte per INTID.
    pub const IPRIORITYR: u64 = 0x0400;
    /// Configuration registers, two bits per INTID (bit 1: edge).
    pub const ICFGR: u64 = 0x0C00;
    /// One register block of 32 INTIDs at one bit each spans 0x80 bytes.
    pub const BITS_BLOCK: u64 = 0x80;
    /// The priority block spans 1020 bytes (0x400..0x7FC).
    pub const PRIORITY_BLOCK: u64 = 0x400;
    /// The configuration block spans 0x100 bytes.
    pub const CONFIG_BLOCK: u64 = 0x100;
}

/// Wired interrupts `base..base+count`, each with enable, pending latch,
/// line level, active, group, trigger and priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrqBank {
    base: u32,
    count: u32,
    enabled: Bitmap,
    latch: Bitmap,
    line: Bitmap,
    active: Bitmap,
    group1: Bitmap,
    edge: Bitmap,
    /// INTIDs below this are edge-triggered and their configuration is
    /// read-only (SGIs).
    fixed_edge_below: u32,
    priority: Box<[u8]>,
    mask: u8,
}

impl IrqBank {
    /// Reset state for INTIDs `base..base+count` (base a multiple of 32):
    /// disabled, idle, group 0, priority 0, level-sensitive except those
    /// below `fixed_edge_below`, which are edge-triggered for good.
    pub fn new(base: u32, count: u32, priority_bits: u8, fixed_edge_below: u32) -> Self {
        let mut edge = Bitmap::new(count);
        for i in base..fixed_edge_below.min(base + count) {
            edge.set(i - base);
        }
        IrqBank {
            base,
            count,
            enabled: Bitmap::new(count),
            latch: Bitmap::new(count),
            line: Bitmap::new(count),
            active: Bitmap::new(count),
            group1: Bitmap::new(count),
            edge,
            fixed_edge_below,
            priority: vec![0; count as usize].into_boxed_slice(),
            mask: priority_mask(priority_bits),
        }
    }

    /// Whether `intid` belongs to this bank.
    pub fn contains(&self, intid: u32) -> bool {
        intid >= self.base && intid - self.base < self.count
    }

    fn idx(&self, intid: u32) -> Result<u32, GicError> {
        if self.contains(intid) {
            Ok(intid - self.base)
        } else {
            Err(GicError::Intid(intid))
        }
    }

    /// Whether `intid` is pending (latched, or a level line held high).
    pub fn is_pending(&self, intid: u32) -> bool {
        self.idx(intid).is_ok_and(|i| self.pending_at(i))
    }

    fn pending_at(&self, i: u32) -> bool {
        self.latch.test(i) || (self.line.test(i) && !self.edge.test(i))
    }

    /// Whether `intid` is enabled.
    pub fn is_enabled(&self, intid: u32) -> bool {
        self.idx(intid).is_ok_and(|i| self.enabled.test(i))
    }

    /// Whether `intid` is active.
    pub fn is_active(&self, intid: u32) -> bool {
        self.idx(intid).is_ok_and(|i| self.active.test(i))
    }

    /// Whether `intid` is edge-triggered.
    pub fn is_edge(&self, intid: u32) -> bool {
        self.idx(intid).is_ok_and(|i| self.edge.test(i))
    }

    /// The priority of `intid` (0 if outside the bank).
    pub fn priority(&self, intid: u32) -> u8 {
        self.idx(intid)
            .map(|i| self.priority[i as usize])
            .unwrap_or(0)
    }

    /// The group of `intid`.
    pub fn group(&self, intid: u32) -> Group {
        Group::from_bit(self.idx(intid).is_ok_and(|i| self.group1.test(i)))
    }

    /// Enables or disables `intid` (ISENABLER/ICENABLER).
    pub fn set_enabled(&mut self, intid: u32, on: bool) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        self.enabled.assign(i, on);
        Ok(())
    }

    /// Sets the priority (unimplemented low bits are dropped).
    pub fn set_priority(&mut self, intid: u32, priority: u8) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        self.priority[i as usize] = priority & self.mask;
        Ok(())
    }

    /// Sets the group (IGROUPR).
    pub fn set_group(&mut self, intid: u32, group: Group) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        self.group1.assign(i, group == Group::G1);
        Ok(())
    }

    /// Sets edge (true) or level (false) triggering (ICFGR). SGIs are always
    /// edge-triggered; asking otherwise is refused.
    pub fn set_edge(&mut self, intid: u32, edge: bool) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        if intid < self.fixed_edge_below {
            return if edge {
                Ok(())
            } else {
                Err(GicError::Reserved {
                    reg: "ICFGR (SGI)",
                    value: u64::from(intid),
                })
            };
        }
        self.edge.assign(i, edge);
        Ok(())
    }

    /// Drives the input line of `intid`. An edge-triggered interrupt latches
    /// pending on a rising edge; a level-sensitive one is pending while the
    /// line is high. Returns whether the interrupt became pending.
    pub fn set_line(&mut self, intid: u32, level: bool) -> Result<bool, GicError> {
        let i = self.idx(intid)?;
        let was = self.pending_at(i);
        let rising = level && !self.line.test(i);
        self.line.assign(i, level);
        if rising && self.edge.test(i) {
            self.latch.set(i);
        }
        Ok(!was && self.pending_at(i))
    }

    /// Latches `intid` pending (ISPENDR, or an SGI arriving); true if it
    /// was not pending before.
    pub fn set_pending(&mut self, intid: u32) -> Result<bool, GicError> {
        let i = self.idx(intid)?;
        let was = self.pending_at(i);
        self.latch.set(i);
        Ok(!was)
    }

    /// Clears the pending latch (ICPENDR); a level line still high keeps a
    /// level-sensitive interrupt pending.
    pub fn clear_pending(&mut self, intid: u32) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        self.latch.clear(i);
        Ok(())
    }

    /// The acknowledge of `intid`: the pending latch clears and it becomes
    /// active (a level line still high leaves it active and pending).
    pub fn acknowledge(&mut self, intid: u32) -> Result<(), GicError> {
        let i = self.idx(intid)?;
        self.latch.clear(i);
        self.active.set(i);
        Ok(())
    }

    /// Sets or clears the active state (ISACTIVER/ICACTIVER, deactivation);
    /// returns whether it was active.
    pub fn set_active(&mut self, intid: u32, on: bool) -> Result<bool, GicError> {
        let i = self.idx(intid)?;
        let was = self.active.test(i);
        self.active.assign(i, on);
        Ok(was)
    }

    /// The best enabled, pending, not active interrupt of `group` for which
    /// `admit` holds (the distributor uses it for routing). Word-wise over
    /// the bitmaps; allocates nothing.
    pub fn best(&self, group: Option<Group>, admit: impl Fn(u32) -> bool) -> Option<Candidate> {
        let mut best: Option<Candidate> = None;
        for w in 0..self.enabled.words().len() {
            let pend = self.latch.words()[w] | (self.line.words()[w] & !self.edge.words()[w]);
            let mut ready = pend & self.enabled.words()[w] & !self.active.words()[w];
            while ready != 0 {
                let i = w as u32 * 64 + ready.trailing_zeros();
                ready &= ready - 1;
                let intid = self.base + i;
                let c = Candidate {
                    intid,
                    priority: self.priority[i as usize],
                    group: Group::from_bit(self.group1.test(i)),
                };
                if group.is_some_and(|g| g != c.group) || !admit(intid) {
                    continue;
                }
                if best.is_none_or(|b| c.beats(&b)) {
                    best = Some(c);
                }
            }
        }
        best
    }

    /// The INTIDs pending now, lowest first.
    pub fn pending(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.count)
            .filter(|i| self.pending_at(*i))
            .map(|i| self.base + i)
    }

    /// Bit chunk `n` (INTIDs 32n..32n+31) as a register reads, 0 outside
    /// the bank.
    fn chunk(&self, bits: &Bitmap, n: u32) -> u32 {
        match (n * 32).checked_sub(self.base) {
            Some(rel) => bits.word32(rel / 32),
            None => 0,
        }
    }

    /// Reads a register of the shared layout at `offset` (relative to
    /// GICD_base or SGI_base); None if `offset` is not one of them.
    /// Registers of INTIDs outside the bank read as zero.
    pub fn mmio_read(&self, offset: u64) -> Option<u32> {
        use offsets::*;
        let bit_reg = |start: u64| {
            (start..start + BITS_BLOCK)
                .contains(&offset)
                .then(|| ((offset - start) / 4) as u32)
        };
        if let Some(n) = bit_reg(IGROUPR) {
            return Some(self.chunk(&self.group1, n));
        }
        for (s, c) in [(ISENABLER, ICENABLER), (ISACTIVER, ICACTIVER)] {
            let bits = if s == ISENABLER {
                &self.enabled
            } else {
                &self.active
            };
            if let Some(n) = bit_reg(s).or_else(|| bit_reg(c)) {
                return Some(self.chunk(bits, n));
            }
        }
        if let Some(n) = bit_reg(ISPENDR).or_else(|| bit_reg(ICPENDR)) {
            return Some(
                (0..32)
                    .filter(|b| self.is_pending(n * 32 + b))
                    .fold(0, |acc, b| acc | (1 << b)),
            );
        }
        if (IPRIORITYR..IPRIORITYR + PRIORITY_BLOCK).contains(&offset) {
            let first = ((offset - IPRIORITYR) & !3) as u32;
            return Some((0..4).fold(0, |acc, k| {
                acc | (u32::from(self.priority(first + k)) << (8 * k))
            }));
        }
        if (ICFGR..ICFGR + CONFIG_BLOCK).contains(&offset) {
            let first = ((offset - ICFGR) / 4) as u32 * 16;
            return Some((0..16).fold(0, |acc, k| {
                acc | (u32::from(self.is_edge(first + k)) << (2 * k + 1))
            }));
        }
        None
    }

    /// Writes a register of the shared layout; None if `offset` is not one
    /// of them. Bits of INTIDs outside the bank are ignored (RAZ/WI), as are
    /// attempts to make an SGI level-sensitive.
    pub fn mmio_write(&mut self, offset: u64, v: u32) -> Option<()> {
        use offsets::*;
        let bit_reg = |start: u64| {
            (start..start + BITS_BLOCK)
                .contains(&offset)
                .then(|| ((offset - start) / 4) as u32)
        };
        // Every per-INTID setter below is given INTIDs the bank holds, so
        // their errors cannot occur; `ok()` discards them.
        if let Some(n) = bit_reg(IGROUPR) {
            for b in 0..32 {
                let intid = n * 32 + b;
                self.set_group(intid, Group::from_bit(v & (1 << b) != 0))
                    .ok();
            }
            return Some(());
        }
        type Op = fn(&mut IrqBank, u32);
        let ops: [(u64, Op); 6] = [
            (ISENABLER, |s, i| {
                s.set_enabled(i, true).ok();
            }),
            (ICENABLER, |s, i| {
                s.set_enabled(i, false).ok();
            }),
            (ISPENDR, |s, i| {
                s.set_pending(i).ok();
            }),
            (ICPENDR, |s, i| {
                s.clear_pending(i).ok();
            }),
            (ISACTIVER, |s, i| {
                s.set_active(i, true).ok();
            }),
            (ICACTIVER, |s, i| {
                s.set_active(i, false).ok();
            }),
        ];
        for (start, op) in ops {
            if let Some(n) = bit_reg(start) {
                for b in (0..32).filter(|b| v & (1 << b) != 0) {
                    op(self, n * 32 + b);
                }
                return Some(());
            }
        }
        if (IPRIORITYR..IPRIORITYR + PRIORITY_BLOCK).contains(&offset) {
            let first = ((offset - IPRIORITYR) & !3) as u32;
            for k in 0..4 {
                self.set_priority(first + k, (v >> (8 * k)) as u8).ok();
            }
            return Some(());
        }
        if (ICFGR..ICFGR + CONFIG_BLOCK).contains(&offset) {
            let first = ((offset - ICFGR) / 4) as u32 * 16;
            for k in 0..16 {
                self.set_edge(first + k, v & (1 << (2 * k + 1)) != 0).ok();
            }
            return Some(());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spis() -> IrqBank {
        IrqBank::new(32, 64, 5, 16)
    }

    #[test]
    fn edge_latches_on_rising_edge_only() {
        let mut b = spis();
        b.set_edge(40, true).unwrap();
        assert_eq!(b.set_line(40, true), Ok(true));
        assert_eq!(b.set_line(40, true), Ok(false), "no new edge");
        b.acknowledge(40).unwrap();
        assert!(!b.is_pending(40), "the latch clears at acknowledge");
        assert!(b.is_active(40));
        b.set_line(40, false).unwrap();
        assert_eq!(b.set_line(40, true), Ok(true), "a new edge while active");
        assert!(b.is_pending(40) && b.is_active(40));
    }

    #[test]
    fn level_follows_the_line_and_stays_pending_while_active() {
        let mut b = spis();
        assert_eq!(b.set_line(50, true), Ok(true));
        b.acknowledge(50).unwrap();
        assert!(b.is_pending(50) && b.is_active(50), "line still high");
        b.set_line(50, false).unwrap();
        assert!(!b.is_pending(50));
        // ICPENDR cannot clear a level held high.
        b.set_line(50, true).unwrap();
        b.clear_pending(50).unwrap();
        assert!(b.is_pending(50));
    }

    #[test]
    fn best_skips_disabled_active_and_other_groups() {
        let mut b = spis();
        for (i, p) in [(33, 0x80), (34, 0x40), (35, 0x40), (36, 0x10)] {
            b.set_priority(i, p).unwrap();
            b.set_group(i, Group::G1).unwrap();
            b.set_enabled(i, true).unwrap();
            b.set_pending(i).unwrap();
        }
        b.set_enabled(36, false).unwrap();
        let best = b.best(Some(Group::G1), |_| true).unwrap();
        assert_eq!(
            (best.intid, best.priority),
            (34, 0x40),
            "tie -> lower INTID"
        );
        b.acknowledge(34).unwrap();
        assert_eq!(b.best(Some(Group::G1), |_| true).unwrap().intid, 35);
        assert_eq!(b.best(Some(Group::G1), |i| i != 35).unwrap().intid, 33);
        assert_eq!(b.best(Some(Group::G0), |_| true), None);
    }

    #[test]
    fn register_layout_round_trips() {
        use offsets::*;
        let mut b = spis();
        // INTIDs 32..63 are chunk 1.
        assert_eq!(b.mmio_write(ISENABLER + 4, 0b101), Some(()));
        assert!(b.is_enabled(32) && !b.is_enabled(33) && b.is_enabled(34));
        assert_eq!(b.mmio_read(ICENABLER + 4), Some(0b101));
        b.mmio_write(ICENABLER + 4, 0b1).unwrap();
        assert_eq!(b.mmio_read(ISENABLER + 4), Some(0b100));
        // Chunk 0 (SGIs/PPIs) is not in this bank: RAZ/WI.
        b.mmio_write(ISENABLER, u32::MAX).unwrap();
        assert_eq!(b.mmio_read(ISENABLER), Some(0));
        // Priorities: INTID 33 is byte 1 of word 8 (INTIDs 32..35).
        b.mmio_write(IPRIORITYR + 32, 0x0000_A700).unwrap();
        assert_eq!(b.priority(33), 0xA0, "low 3 bits unimplemented");
        assert_eq!(b.mmio_read(IPRIORITYR + 33), Some(0x0000_A000));
        // Config: INTID 37 is field 5 of ICFGR2 (INTIDs 32..47).
        b.mmio_write(ICFGR + 8, 1 << 11).unwrap();
        assert!(b.is_edge(37) && !b.is_edge(36));
        assert_eq!(b.mmio_read(ICFGR + 8), Some(1 << 11));
        b.mmio_write(ISPENDR + 4, 1 << 9).unwrap();
        assert_eq!(b.mmio_read(ICPENDR + 4), Some(1 << 9));
        b.mmio_write(IGROUPR + 4, 1 << 9).unwrap();
        assert_eq!(b.group(41), Group::G1);
        assert_eq!(b.mmio_read(0x0004), None);
    }

    #[test]
    fn sgis_stay_edge_triggered() {
        let mut b = IrqBank::new(0, 32, 5, 16);
        assert!(b.is_edge(3));
        assert!(b.set_edge(3, false).is_err());
        b.mmio_write(offsets::ICFGR, 0).unwrap();
        assert!(b.is_edge(3), "ICFGR0 is read-only");
        assert!(!b.is_edge(20), "PPIs reset level-sensitive");
        assert_eq!(b.set_enabled(32, true), Err(GicError::Intid(32)));
    }
}
