//! Priority, preemption and the active-priorities stack, shared by the
//! physical CPU interface (ICC_*) and the virtual one (ICV_*/ICH_VMCR_EL2)
//! (GICv3 spec §4.8 "Interrupt prioritization", §4.8.3 "Preemption",
//! §12.2.1/§12.2.2 ICC_AP0Rn/AP1Rn).
//!
//! Lower values are higher priorities. An interrupt is signalled to the PE
//! when its group is enabled, its priority is higher than the priority mask
//! (PMR) and its *group priority* (the bits above the binary point) is
//! higher than the running priority. Acknowledging it sets the bit of its
//! group priority in the active-priorities registers; a priority drop (EOI)
//! clears the highest set bit; the running priority is the highest one still
//! set, or idle (0xFF).

/// The idle running priority: nothing active.
pub const IDLE_PRIORITY: u8 = 0xFF;

/// An interrupt group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Group 0: signalled as FIQ, acknowledged through ICC_IAR0_EL1.
    G0,
    /// Group 1 (non-secure): signalled as IRQ, acknowledged through
    /// ICC_IAR1_EL1.
    G1,
}

impl Group {
    /// The group a GICD_IGROUPR/ICH_LR group bit selects.
    pub fn from_bit(g1: bool) -> Self {
        if g1 {
            Group::G1
        } else {
            Group::G0
        }
    }

    /// Index 0 or 1.
    pub fn index(self) -> usize {
        match self {
            Group::G0 => 0,
            Group::G1 => 1,
        }
    }
}

/// The highest-priority pending interrupt a source (distributor,
/// redistributor, list registers, a resident vPE's pending table) offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its INTID (vINTID for virtual sources).
    pub intid: u32,
    /// Its priority, already cut to the implemented bits.
    pub priority: u8,
    /// Its group.
    pub group: Group,
}

impl Candidate {
    /// Whether `self` wins over `other`: a higher priority, or the same
    /// priority and a lower INTID (the tie-break is IMPLEMENTATION DEFINED;
    /// lowest INTID is what gem5 and KVM's vgic do).
    pub fn beats(&self, other: &Candidate) -> bool {
        (self.priority, self.intid) < (other.priority, other.intid)
    }
}

/// The better of two optional candidates.
pub fn pick(a: Option<Candidate>, b: Option<Candidate>) -> Option<Candidate> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.beats(&x) { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The mask of the `bits` implemented priority bits (the top ones): 5 bits
/// give 0xF8.
pub fn priority_mask(bits: u8) -> u8 {
    (0xFF_u16 << (8 - bits.clamp(1, 8))) as u8
}

/// Bits a binary point of `bpr` keeps as the group priority: [7:bpr] for
/// group 1 and [7:bpr+1] for group 0 (GICv3 §4.8.5, table 4-7).
fn group_priority_mask(bpr: u8, group: Group) -> u8 {
    let shift = match group {
        Group::G0 => bpr + 1,
        Group::G1 => bpr,
    };
    (0xFF_u16 << shift.min(8)) as u8
}

/// The active-priorities registers (ICC_AP0Rn/AP1Rn, or ICH_AP0Rn/AP1Rn for
/// the virtual interface): one bit per group-priority level per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivePriorities {
    bits: [u128; 2],
    /// Right shift from a group priority to its bit: 8 - preemption bits.
    shift: u8,
}

impl ActivePriorities {
    /// Empty, for `preemption_bits` (5..=7) levels of preemption.
    pub fn new(preemption_bits: u8) -> Self {
        ActivePriorities {
            bits: [0; 2],
            shift: 8 - preemption_bits.clamp(1, 7),
        }
    }

    /// Marks group priority `gprio` of `group` active.
    pub fn set(&mut self, gprio: u8, group: Group) {
        self.bits[group.index()] |= 1u128 << (gprio >> self.shift);
    }

    /// The highest active priority, across both groups.
    pub fn highest(&self) -> Option<u8> {
        let any = self.bits[0] | self.bits[1];
        (any != 0).then(|| (any.trailing_zeros() as u8) << self.shift)
    }

    /// Priority drop: clears the highest active priority and returns it with
    /// its group (group 0 first when both hold the same level).
    pub fn drop_highest(&mut self) -> Option<(u8, Group)> {
        let p = self.highest()?;
        let bit = 1u128 << (p >> self.shift);
        let g = if self.bits[0] & bit != 0 {
            Group::G0
        } else {
            Group::G1
        };
        self.bits[g.index()] &= !bit;
        Some((p, g))
    }

    /// Whether nothing is active.
    pub fn is_empty(&self) -> bool {
        self.bits == [0, 0]
    }

    /// Register `ICC_AP<group>R<n>` (n = 0..=3), 0 past the implemented ones.
    pub fn register(&self, group: Group, n: u32) -> u32 {
        if n >= 4 {
            return 0;
        }
        (self.bits[group.index()] >> (32 * n)) as u32
    }
}

/// The per-interface priority state: PMR, the binary points, CBPR, EOImode,
/// the group enables and the active priorities. The physical CPU interface
/// keeps one (ICC_PMR/BPR0/BPR1/CTLR/IGRPEN0/IGRPEN1_EL1); the virtual
/// interface keeps another (the fields of ICH_VMCR_EL2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityControl {
    pmr: u8,
    bpr0: u8,
    bpr1: u8,
    cbpr: bool,
    eoi_mode: bool,
    enabled: [bool; 2],
    apr: ActivePriorities,
    mask: u8,
    preemption_bits: u8,
}

impl PriorityControl {
    /// Reset state for `priority_bits` implemented bits: PMR 0 (everything
    /// masked), binary points at their minimum, groups disabled, EOImode 0.
    pub fn new(priority_bits: u8) -> Self {
        let preemption_bits = priority_bits.clamp(4, 7);
        let mut p = PriorityControl {
            pmr: 0,
            bpr0: 0,
            bpr1: 0,
            cbpr: false,
            eoi_mode: false,
            enabled: [false; 2],
            apr: ActivePriorities::new(preemption_bits),
            mask: priority_mask(priority_bits),
            preemption_bits,
        };
        p.bpr0 = p.bpr0_min();
        p.bpr1 = p.bpr0_min() + 1;
        p
    }

    /// The smallest ICC_BPR0 value: 7 - preemption bits.
    pub fn bpr0_min(&self) -> u8 {
        7 - self.preemption_bits
    }

    /// The implemented-priority mask.
    pub fn mask(&self) -> u8 {
        self.mask
    }

    /// ICC_PMR_EL1 / ICH_VMCR_EL2.VPMR.
    pub fn pmr(&self) -> u8 {
        self.pmr
    }

    /// Writes the priority mask; unimplemented low bits read as zero.
    pub fn set_pmr(&mut self, v: u8) {
        self.pmr = v & self.mask;
    }

    /// The binary point of `group` as software reads it (with CBPR set,
    /// group 1 reads BPR0 + 1, saturated at 7).
    pub fn bpr(&self, group: Group) -> u8 {
        match group {
            Group::G0 => self.bpr0,
            Group::G1 if self.cbpr => (self.bpr0 + 1).min(7),
            Group::G1 => self.bpr1,
        }
    }

    /// Writes a binary point (bits \[2:0\]); values below the minimum are
    /// raised to it. With CBPR set, group-1 writes are ignored.
    pub fn set_bpr(&mut self, group: Group, v: u8) {
        let v = v & 7;
        match group {
            Group::G0 => self.bpr0 = v.max(self.bpr0_min()),
            Group::G1 if self.cbpr => {}
            Group::G1 => self.bpr1 = v.max(self.bpr0_min() + 1),
        }
    }

    /// CBPR: group 1 preempts by BPR0 too.
    pub fn cbpr(&self) -> bool {
        self.cbpr
    }

    /// Sets CBPR.
    pub fn set_cbpr(&mut self, on: bool) {
        self.cbpr = on;
    }

    /// EOImode: 0 = EOIR drops priority and deactivates; 1 = EOIR only
    /// drops priority, DIR deactivates.
    pub fn eoi_mode(&self) -> bool {
        self.eoi_mode
    }

    /// Sets EOImode.
    pub fn set_eoi_mode(&mut self, split: bool) {
        self.eoi_mode = split;
    }

    /// `ICC_IGRPEN<g>_EL1` / ICH_VMCR_EL2.`VENG<g>`.
    pub fn group_enabled(&self, group: Group) -> bool {
        self.enabled[group.index()]
    }

    /// Enables or disables signalling of `group`.
    pub fn set_group_enabled(&mut self, group: Group, on: bool) {
        self.enabled[group.index()] = on;
    }

    /// The group (preemption) priority of `priority` in `group` under the
    /// current binary point.
    pub fn group_priority(&self, priority: u8, group: Group) -> u8 {
        // With CBPR, group 1 is split at BPR0 like group 0.
        let split = if group == Group::G0 || self.cbpr {
            group_priority_mask(self.bpr0, Group::G0)
        } else {
            group_priority_mask(self.bpr1, Group::G1)
        };
        priority & self.mask & split
    }

    /// The running priority (ICC_RPR_EL1): the highest active group
    /// priority, or idle.
    pub fn running(&self) -> u8 {
        self.apr.highest().unwrap_or(IDLE_PRIORITY)
    }

    /// The active priorities.
    pub fn active_priorities(&self) -> &ActivePriorities {
        &self.apr
    }

    /// Whether `c` would be signalled now: its group enabled, its priority
    /// above the mask and its group priority above the running priority.
    pub fn signals(&self, c: &Candidate) -> bool {
        self.group_enabled(c.group)
            && c.priority < self.pmr
            && self.group_priority(c.priority, c.group) < self.running()
    }

    /// Acknowledge: records `c`'s group priority as active.
    pub fn activate(&mut self, c: &Candidate) {
        let g = self.group_priority(c.priority, c.group);
        self.apr.set(g, c.group);
    }

    /// Priority drop: clears the highest active priority; None if nothing
    /// was active.
    pub fn drop_priority(&mut self) -> Option<(u8, Group)> {
        self.apr.drop_highest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(intid: u32, priority: u8, group: Group) -> Candidate {
        Candidate {
            intid,
            priority,
            group,
        }
    }

    #[test]
    fn lower_value_wins_then_lower_intid() {
        let a = cand(40, 0x80, Group::G1);
        let b = cand(33, 0x80, Group::G1);
        let c = cand(50, 0x40, Group::G1);
        assert_eq!(pick(Some(a), Some(b)), Some(b));
        assert_eq!(pick(Some(b), Some(c)), Some(c));
        assert_eq!(pick(None, Some(a)), Some(a));
        assert_eq!(pick(None, None), None);
    }

    #[test]
    fn masks_follow_implemented_bits() {
        assert_eq!(priority_mask(5), 0xF8);
        assert_eq!(priority_mask(8), 0xFF);
        assert_eq!(priority_mask(4), 0xF0);
        let mut p = PriorityControl::new(5);
        p.set_pmr(0xFF);
        assert_eq!(p.pmr(), 0xF8);
    }

    #[test]
    fn binary_point_minimums_and_group_priority() {
        let mut p = PriorityControl::new(5);
        assert_eq!(p.bpr0_min(), 2);
        assert_eq!(p.bpr(Group::G1), 3, "reset BPR1 = BPR0 min + 1");
        p.set_bpr(Group::G1, 0);
        assert_eq!(p.bpr(Group::G1), 3, "raised to its minimum");
        assert_eq!(p.group_priority(0xA8, Group::G1), 0xA8);
        p.set_bpr(Group::G1, 5);
        // Group priority [7:5]: 0xA8 -> 0xA0.
        assert_eq!(p.group_priority(0xA8, Group::G1), 0xA0);
        p.set_bpr(Group::G0, 5);
        // Group 0 splits at [7:6]: 0xA8 -> 0x80.
        assert_eq!(p.group_priority(0xA8, Group::G0), 0x80);
        p.set_cbpr(true);
        assert_eq!(p.bpr(Group::G1), 6);
        assert_eq!(p.group_priority(0xA8, Group::G1), 0x80);
        p.set_bpr(Group::G1, 2);
        assert_eq!(p.bpr(Group::G1), 6, "BPR1 writes ignored under CBPR");
    }

    #[test]
    fn signalling_needs_enable_mask_and_preemption() {
        let mut p = PriorityControl::new(5);
        let c = cand(40, 0x80, Group::G1);
        assert!(!p.signals(&c), "group disabled, PMR 0");
        p.set_group_enabled(Group::G1, true);
        assert!(!p.signals(&c), "PMR 0 masks everything");
        p.set_pmr(0x80);
        assert!(!p.signals(&c), "priority must be strictly above the mask");
        p.set_pmr(0xF0);
        assert!(p.signals(&c));
        p.activate(&c);
        assert_eq!(p.running(), 0x80);
        assert!(
            !p.signals(&cand(41, 0x80, Group::G1)),
            "same level cannot preempt"
        );
        assert!(p.signals(&cand(42, 0x78, Group::G1)));
        // A coarser binary point puts 0x98 in the running group 0x80.
        p.set_bpr(Group::G1, 5);
        assert!(!p.signals(&cand(43, 0x98, Group::G1)));
        assert_eq!(p.drop_priority(), Some((0x80, Group::G1)));
        assert_eq!(p.running(), IDLE_PRIORITY);
        assert_eq!(p.drop_priority(), None);
    }

    #[test]
    fn active_priorities_stack_and_registers() {
        let mut a = ActivePriorities::new(5);
        a.set(0x80, Group::G1);
        a.set(0x20, Group::G0);
        a.set(0x40, Group::G1);
        assert_eq!(a.highest(), Some(0x20));
        assert_eq!(
            a.register(Group::G1, 0),
            (1 << (0x80 >> 3)) | (1 << (0x40 >> 3))
        );
        assert_eq!(a.register(Group::G0, 0), 1 << 4);
        assert_eq!(a.register(Group::G1, 4), 0);
        assert_eq!(a.drop_highest(), Some((0x20, Group::G0)));
        assert_eq!(a.drop_highest(), Some((0x40, Group::G1)));
        assert_eq!(a.drop_highest(), Some((0x80, Group::G1)));
        assert!(a.is_empty());
    }
}
