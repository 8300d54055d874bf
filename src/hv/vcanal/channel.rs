//! vCanal's communication channel (vcanal.md §2.1, §2.4, §7): a bounded
//! multi-producer single-consumer ring plus an INR pool, both in a few guest
//! pages the helper driver allocates at boot and announces once.
//!
//! # Layout (from the announced base GPA; little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | u64 | `tail`: next position producers claim (CAS) |
//! | 8 .. 64 | | padding (own cache line) |
//! | 64 | capacity × 16 | ring slots: `seq` u64, `inr` u32 (pool index), `status` i32 |
//! | align 64 | pool_len × [`INR_SIZE`] | INR pool |
//!
//! The ring is Vyukov's bounded queue (§7: FastForward is single-producer,
//! so per-slot sequence numbers with a CAS on the tail). Slot `i` starts
//! with `seq = i`. A producer at position `pos` claims the slot when
//! `seq == pos` by moving `tail` from `pos` to `pos + 1`, writes its INR
//! index and publishes with `seq = pos + 1`; `seq < pos` means the ring is
//! full. The consumer's position (`head`) lives in host memory only: it
//! takes the slot at `head` when `seq == head + 1`, writes `status` (0, or
//! a negative errno for an entry it refused) and releases it with
//! `seq = head + capacity`. The host never reads `tail`, so no guest value
//! can steer it beyond the slot at its own `head`.

use crate::guest::libcanal::inr::INR_SIZE;
use crate::hw::guest_memory::{GuestMemory, MemError};

/// Bytes before the ring (the `tail` cache line).
pub const HEADER_SIZE: u64 = 64;
/// Bytes of one ring slot.
pub const SLOT_SIZE: u64 = 16;
/// Offset of `seq` in a slot.
const SLOT_SEQ: u64 = 0;
/// Offset of `inr` in a slot.
const SLOT_INR: u64 = 8;
/// Offset of `status` in a slot.
const SLOT_STATUS: u64 = 12;
/// Alignment of the pool.
const POOL_ALIGN: u64 = 64;

/// What the helper driver announces at boot (one exit, §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelLayout {
    /// GPA of the channel's first byte.
    pub base: u64,
    /// Ring slots (a power of two).
    pub ring_capacity: u32,
    /// INRs in the pool.
    pub pool_len: u32,
}

/// The host's limits on an announced channel (host memory is sized from
/// these, never from the guest's numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelLimits {
    /// Largest ring accepted.
    pub max_ring_capacity: u32,
    /// Largest pool accepted.
    pub max_pool_len: u32,
}

/// Why an announced channel is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// Ring capacity zero, not a power of two, or over the host's limit.
    #[error("ring capacity {0} is not a power of two within the host's limit")]
    BadCapacity(u32),
    /// Pool empty or over the host's limit.
    #[error("INR pool of {0} is empty or over the host's limit")]
    BadPool(u32),
    /// The channel does not lie inside the VM's backed guest RAM.
    #[error("channel not inside guest memory: {0}")]
    Outside(MemError),
    /// The base is not 64-byte aligned.
    #[error("channel base {0:#x} is not 64-byte aligned")]
    Misaligned(u64),
}

/// A producer could not enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// Every slot holds an entry the host has not taken (§7: the
    /// enqueuer spins and retries).
    #[error("ring full")]
    Full,
    /// The slot at `tail` is ahead of it: only a corrupted ring (the
    /// guest's own memory) does this in a one-step-at-a-time simulation.
    #[error("ring state inconsistent")]
    Inconsistent,
    /// The channel is not in guest memory.
    #[error("{0}")]
    Mem(#[from] MemError),
}

impl ChannelLayout {
    /// GPA of `tail`.
    pub fn tail_gpa(&self) -> u64 {
        self.base
    }

    /// GPA of the ring slot position `pos` uses.
    pub fn slot_gpa(&self, pos: u64) -> u64 {
        let mask = self.ring_capacity as u64 - 1;
        self.base + HEADER_SIZE + (pos & mask) * SLOT_SIZE
    }

    /// Offset of the pool from `base`.
    fn pool_offset(&self) -> u64 {
        (HEADER_SIZE + self.ring_capacity as u64 * SLOT_SIZE).next_multiple_of(POOL_ALIGN)
    }

    /// GPA of INR `index`, if the pool has it.
    pub fn inr_gpa(&self, index: u32) -> Option<u64> {
        (index < self.pool_len)
            .then(|| self.base + self.pool_offset() + index as u64 * INR_SIZE as u64)
    }

    /// Bytes the channel spans.
    pub fn size(&self) -> u64 {
        self.pool_offset() + self.pool_len as u64 * INR_SIZE as u64
    }

    /// The host's check of an announcement: sizes within `limits`, the
    /// whole channel inside the VM's backed guest memory.
    pub fn check(&self, mem: &GuestMemory, limits: &ChannelLimits) -> Result<(), ChannelError> {
        let c = self.ring_capacity;
        if !c.is_power_of_two() || c > limits.max_ring_capacity {
            return Err(ChannelError::BadCapacity(c));
        }
        if self.pool_len == 0 || self.pool_len > limits.max_pool_len {
            return Err(ChannelError::BadPool(self.pool_len));
        }
        if !self.base.is_multiple_of(POOL_ALIGN) {
            return Err(ChannelError::Misaligned(self.base));
        }
        // With both sizes bounded by u32, size() cannot overflow.
        mem.check_backed(self.base, self.size())
            .map_err(ChannelError::Outside)
    }

    /// The helper driver's boot-time initialisation: zero the channel and
    /// give slot `i` sequence `i`.
    pub fn init(&self, mem: &mut GuestMemory) -> Result<(), MemError> {
        mem.fill(self.base, self.size(), 0)?;
        for i in 0..self.ring_capacity as u64 {
            mem.write_u64(self.slot_gpa(i) + SLOT_SEQ, i)?;
        }
        Ok(())
    }
}

/// A producer's claimed ring position, to publish later (a guest thread
/// can be preempted between the two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The position.
    pub pos: u64,
}

/// `seq - pos` as a signed distance.
fn distance(seq: u64, pos: u64) -> i64 {
    seq.wrapping_sub(pos) as i64
}

/// Producer step 1: claim the position at `tail`.
pub fn claim(mem: &mut GuestMemory, l: &ChannelLayout) -> Result<Claim, RingError> {
    let pos = mem.read_u64(l.tail_gpa())?;
    let seq = mem.read_u64(l.slot_gpa(pos) + SLOT_SEQ)?;
    match distance(seq, pos) {
        0 => match mem.compare_exchange_u64(l.tail_gpa(), pos, pos.wrapping_add(1))? {
            Ok(_) => Ok(Claim { pos }),
            Err(_) => Err(RingError::Inconsistent),
        },
        d if d < 0 => Err(RingError::Full),
        _ => Err(RingError::Inconsistent),
    }
}

/// Producer step 2: write INR index `inr` into the claimed slot and
/// publish it.
pub fn publish(
    mem: &mut GuestMemory,
    l: &ChannelLayout,
    c: Claim,
    inr: u32,
) -> Result<(), MemError> {
    let slot = l.slot_gpa(c.pos);
    mem.write_u32(slot + SLOT_INR, inr)?;
    mem.write_u32(slot + SLOT_STATUS, 0)?;
    mem.write_u64(slot + SLOT_SEQ, c.pos.wrapping_add(1))
}

/// Claim and publish in one go.
pub fn enqueue(mem: &mut GuestMemory, l: &ChannelLayout, inr: u32) -> Result<(), RingError> {
    let c = claim(mem, l)?;
    publish(mem, l, c, inr)?;
    Ok(())
}

/// What the slot of position `pos` holds: the INR index published there
/// and the status a consumer left (0: taken; negative: the errno the host
/// refused the entry with).
pub fn slot_entry(mem: &GuestMemory, l: &ChannelLayout, pos: u64) -> Result<(u32, i32), MemError> {
    let slot = l.slot_gpa(pos);
    Ok((
        mem.read_u32(slot + SLOT_INR)?,
        mem.read_u32(slot + SLOT_STATUS)? as i32,
    ))
}

/// The host's end of one VM's ring: the consumer position, in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Consumer {
    /// The checked layout.
    pub layout: ChannelLayout,
    /// Next position to take.
    pub head: u64,
}

impl Consumer {
    /// The consumer of a checked, freshly initialised channel.
    pub fn new(layout: ChannelLayout) -> Self {
        Self { layout, head: 0 }
    }

    /// The INR index published at `head`, if that slot is ready. Reading
    /// does not take it.
    pub fn peek(&self, mem: &GuestMemory) -> Result<Option<u32>, MemError> {
        let slot = self.layout.slot_gpa(self.head);
        let seq = mem.read_u64(slot + SLOT_SEQ)?;
        if seq != self.head.wrapping_add(1) {
            return Ok(None);
        }
        mem.read_u32(slot + SLOT_INR).map(Some)
    }

    /// Takes the slot at `head`, leaving `status` in it, and releases it to
    /// producers.
    pub fn consume(&mut self, mem: &mut GuestMemory, status: i32) -> Result<(), MemError> {
        let slot = self.layout.slot_gpa(self.head);
        mem.write_u32(slot + SLOT_STATUS, status as u32)?;
        let next_lap = self.head.wrapping_add(self.layout.ring_capacity as u64);
        mem.write_u64(slot + SLOT_SEQ, next_lap)?;
        self.head = self.head.wrapping_add(1);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A VM with 1 MiB of RAM whose channel (at 0x10000) is backed.
    pub(crate) fn channel(ring_capacity: u32, pool_len: u32) -> (GuestMemory, ChannelLayout) {
        let l = ChannelLayout {
            base: 0x10000,
            ring_capacity,
            pool_len,
        };
        let mut mem = GuestMemory::new(1 << 20, l.base, l.size() as usize).unwrap();
        l.init(&mut mem).unwrap();
        (mem, l)
    }

    const LIMITS: ChannelLimits = ChannelLimits {
        max_ring_capacity: 1024,
        max_pool_len: 1024,
    };

    #[test]
    fn layout_offsets_follow_the_table() {
        let l = ChannelLayout {
            base: 0x10000,
            ring_capacity: 8,
            pool_len: 4,
        };
        assert_eq!(l.slot_gpa(0), 0x10040);
        assert_eq!(l.slot_gpa(9), 0x10050);
        assert_eq!(l.inr_gpa(0), Some(0x100c0));
        assert_eq!(l.inr_gpa(3), Some(0x100c0 + 3 * 0x50));
        assert_eq!(l.inr_gpa(4), None);
        assert_eq!(l.size(), 0xc0 + 4 * 0x50);
    }

    #[test]
    fn announcements_outside_ram_or_limits_are_refused() {
        let (mem, l) = channel(8, 4);
        assert_eq!(l.check(&mem, &LIMITS), Ok(()));
        let bad = |l2: ChannelLayout| l2.check(&mem, &LIMITS).unwrap_err();
        assert_eq!(
            bad(ChannelLayout {
                ring_capacity: 6,
                ..l
            }),
            ChannelError::BadCapacity(6)
        );
        assert_eq!(
            bad(ChannelLayout {
                ring_capacity: 0,
                ..l
            }),
            ChannelError::BadCapacity(0)
        );
        assert_eq!(
            bad(ChannelLayout {
                ring_capacity: 2048,
                ..l
            }),
            ChannelError::BadCapacity(2048)
        );
        assert_eq!(
            bad(ChannelLayout { pool_len: 0, ..l }),
            ChannelError::BadPool(0)
        );
        assert_eq!(
            bad(ChannelLayout { base: 0x10008, ..l }),
            ChannelError::Misaligned(0x10008)
        );
        // A bigger pool runs past the backed pages; a base past RAM is out.
        assert!(matches!(
            bad(ChannelLayout { pool_len: 5, ..l }),
            ChannelError::Outside(MemError::NotBacked { .. })
        ));
        assert!(matches!(
            bad(ChannelLayout {
                base: u64::MAX - 63,
                ..l
            }),
            ChannelError::Outside(MemError::Overflow { .. })
        ));
        assert!(matches!(
            bad(ChannelLayout { base: 1 << 20, ..l }),
            ChannelError::Outside(MemError::OutsideRam { .. })
        ));
    }

    #[test]
    fn fifo_and_a_full_ring_refuses_cleanly() {
        let (mut mem, l) = channel(4, 8);
        let mut c = Consumer::new(l);
        assert_eq!(c.peek(&mem), Ok(None));
        for i in 0..4 {
            enqueue(&mut mem, &l, i).unwrap();
        }
        let before = mem.clone();
        assert_eq!(enqueue(&mut mem, &l, 9), Err(RingError::Full));
        // Refusal changes nothing.
        assert_eq!(mem, before);
        for i in 0..2 {
            assert_eq!(c.peek(&mem), Ok(Some(i)));
            c.consume(&mut mem, 0).unwrap();
        }
        // Two slots free again: wrap around.
        enqueue(&mut mem, &l, 4).unwrap();
        enqueue(&mut mem, &l, 5).unwrap();
        assert_eq!(enqueue(&mut mem, &l, 6), Err(RingError::Full));
        for i in 2..6 {
            assert_eq!(c.peek(&mem), Ok(Some(i)));
            c.consume(&mut mem, -22).unwrap();
            assert_eq!(slot_entry(&mem, &l, c.head - 1), Ok((i, -22)));
        }
        assert_eq!(c.peek(&mem), Ok(None));
    }

    #[test]
    fn a_claimed_but_unpublished_slot_holds_back_later_ones() {
        let (mut mem, l) = channel(4, 8);
        let mut c = Consumer::new(l);
        let a = claim(&mut mem, &l).unwrap();
        let b = claim(&mut mem, &l).unwrap();
        publish(&mut mem, &l, b, 1).unwrap();
        // FIFO by claim order: b is ready but a is not.
        assert_eq!(c.peek(&mem), Ok(None));
        publish(&mut mem, &l, a, 0).unwrap();
        assert_eq!(c.peek(&mem), Ok(Some(0)));
        c.consume(&mut mem, 0).unwrap();
        assert_eq!(c.peek(&mem), Ok(Some(1)));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Claim(usize),
        Publish(usize),
        Consume,
    }

    fn op(producers: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..producers).prop_map(Op::Claim),
            (0..producers).prop_map(Op::Publish),
            Just(Op::Consume),
        ]
    }

    proptest! {
        /// Several guest threads interleave claims and publishes with the
        /// host's takes: every entry a producer published comes out exactly
        /// once, each producer's entries in its own order, and a full ring
        /// refuses without changing memory.
        #[test]
        fn mpsc_keeps_each_producers_order_and_loses_nothing(
            ops in proptest::collection::vec(op(3), 1..300),
            cap_log in 1u32..4,
        ) {
            let (mut mem, l) = channel(1 << cap_log, 64);
            let mut cons = Consumer::new(l);
            // Per producer: its pending claim, next sequence number.
            let mut claims: [Option<Claim>; 3] = [None; 3];
            let mut next = [0u32; 3];
            let mut published = 0u64;
            let mut taken: Vec<u32> = Vec::new();
            for o in ops {
                match o {
                    Op::Claim(p) if claims[p].is_none() => {
                        let before = mem.clone();
                        match claim(&mut mem, &l) {
                            Ok(c) => claims[p] = Some(c),
                            Err(RingError::Full) => prop_assert_eq!(&mem, &before),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::Claim(_) => {}
                    Op::Publish(p) => {
                        if let Some(c) = claims[p].take() {
                            // INR index encodes (producer, sequence).
                            publish(&mut mem, &l, c, (p as u32) << 16 | next[p]).unwrap();
                            next[p] += 1;
                            published += 1;
                        }
                    }
                    Op::Consume => {
                        if let Some(i) = cons.peek(&mem).unwrap() {
                            cons.consume(&mut mem, 0).unwrap();
                            taken.push(i);
                        }
                    }
                }
            }
            // Finish: publish what is claimed, drain.
            for (p, slot) in claims.iter_mut().enumerate() {
                if let Some(c) = slot.take() {
                    publish(&mut mem, &l, c, (p as u32) << 16 | next[p]).unwrap();
                    next[p] += 1;
                    published += 1;
                }
            }
            while let Some(i) = cons.peek(&mem).unwrap() {
                cons.consume(&mut mem, 0).unwrap();
                taken.push(i);
            }
            prop_assert_eq!(taken.len() as u64, published);
            for p in 0..3u32 {
                let mine: Vec<u32> = taken.iter().filter(|&&i| i >> 16 == p).map(|&i| i & 0xffff).collect();
                let want: Vec<u32> = (0..next[p as usize]).collect();
                prop_assert_eq!(mine, want);
            }
        }
    }
}
