//! An Intel 82599-class SR-IOV NIC, receive side, as its virtual functions'
//! drivers (Linux `ixgbevf`) see it, and the 10 GbE link that feeds it.
//!
//! Per VF the model keeps one RX descriptor ring (queue 0) and a small MSI-X
//! table. Each MSI-X vector carries the interrupt state that the 82599
//! datasheet spreads over several VF registers:
//!
//! * the MSI-X table entry (the interrupt-remapping handle the host wrote
//!   into address/data, and the Vector Control mask bit);
//! * `VTEITR`, the interval of the interrupt throttle (EITR);
//! * its bit in `VTEIMS`/`VTEIMC` (enable), `VTEICR` (cause), `VTEICS`
//!   (software-set cause) and `VTEIAM` (auto-mask on fire).
//!
//! The interrupt rule follows the datasheet's "Interrupt Moderation" section:
//! a vector sends its MSI-X message when its cause is set, it is enabled, its
//! table entry is unmasked and at least one EITR interval has passed since it
//! last fired. When only the interval is missing, the NIC's internal ITR
//! countdown holds the interrupt back; the model reports that countdown as an
//! [`IrqAction::CheckAt`] for the platform to schedule.
//!
//! Reset state: the model starts where a VF sits after `ixgbevf_open()`:
//! every vector enabled in `VTEIMS` with auto-mask set in `VTEIAM`, and every
//! MSI-X entry unmasked but *not yet programmed* — the remapping handle comes
//! from the IOMMU model, so the platform must call [`Nic::program_msix`].
//!
//! **Multiple queues and RSS** (`NicConfig::queues` > 1: the function as a
//! native kernel's `ixgbe` drives the PF). Queue pair q (RX ring q, TX ring
//! q) is mapped to MSI-X vector q (the `IVAR` setup of `ixgbe_configure_msix`:
//! one q_vector per queue pair) and the "other" cause to the vector after
//! the last queue. A received frame's queue is chosen by receive-side
//! scaling (82599 datasheet §7.1.2.8): the Toeplitz hash of its IPv4/TCP
//! 4-tuple under the 40-byte key in `RSSRK`, whose seven low bits index the
//! 128-entry redirection table (`RETA`), whose entry names the queue. The
//! driver programs key and table ([`Nic::configure_rss`]). Frames that are
//! not TCP hash on the address pair only (`MRQC` fields TCPIPv4 and IPv4,
//! as ixgbe enables them; UDP's ports are off by default).
//!
//! Nothing allocates after [`Nic::new`]: packets live in a preallocated slot
//! per descriptor, and multi-vector register writes return a fixed-size
//! [`IrqActions`].

use serde::{Deserialize, Serialize};

use crate::engine::{Time, SEC};
use crate::hw::wire::Frame;
use crate::hw::x86::iommu::RemappableMsi;
use std::collections::VecDeque;

/// Largest MSI-X table a VF can have. The 82599 VF exposes three MSI-X
/// vectors (two queue vectors and the mailbox vector), which is also why the
/// VF's `VTEIMS`/`VTEIMC`/`VTEICR` define only bits 2:0.
pub const MAX_VECTORS_PER_VF: u8 = 3;

/// The MSI-X vector that RX queue 0 is mapped to (ixgbevf's `VTIVAR` setup).
pub const RX_QUEUE_VECTOR: u8 = 0;

/// Most queue pairs a function may have: ixgbe's RSS limit
/// (`IXGBE_MAX_RSS_INDICES`, 16 on the 82599).
pub const MAX_QUEUES: u8 = 16;

/// Most MSI-X vectors the model keeps per function: one per queue pair and
/// the "other" vector. A VF has at most [`MAX_VECTORS_PER_VF`]; more are a
/// PF's (the 82599 PF has 64), used when the function has several queues.
pub const MAX_VECTORS: u8 = MAX_QUEUES + 1;

/// Bytes of the RSS hash key (`RSSRK[0..9]`, ten 32-bit registers).
pub const RSS_KEY_BYTES: usize = 40;

/// Entries of the RSS redirection table (`RETA[0..31]`, four 8-bit
/// entries each).
pub const RETA_ENTRIES: usize = 128;

/// The Toeplitz hash (82599 datasheet §7.1.2.8.1; Microsoft's RSS
/// specification): for each bit of `input`, most significant first, that
/// is set, the 32 key bits starting at that bit's position are XORed into
/// the result. `key` must be at least 4 bytes longer than `input`.
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let mut result = 0u32;
    // The key window: 64 bits, the top 32 being the current position's.
    let word = |i: usize| key.get(i).copied().map_or(0, u64::from);
    let mut window = (word(0) << 56)
        | (word(1) << 48)
        | (word(2) << 40)
        | (word(3) << 32)
        | (word(4) << 24)
        | (word(5) << 16)
        | (word(6) << 8)
        | word(7);
    for (next, &byte) in (8..).zip(input) {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                result ^= (window >> 32) as u32;
            }
            window <<= 1;
        }
        // Eight bits consumed: one more key byte enters at the bottom.
        window |= word(next);
    }
    result
}

/// The hash input of a 4-tuple as the 82599 lays it out for TCP/IPv4:
/// source address, destination address, source port, destination port,
/// in network byte order (12 bytes); without ports, the first 8.
pub fn rss_input(t: &crate::hw::wire::Tuple) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..4].copy_from_slice(&t.src_ip);
    b[4..8].copy_from_slice(&t.dst_ip);
    b[8..10].copy_from_slice(&t.src_port.to_be_bytes());
    b[10..12].copy_from_slice(&t.dst_port.to_be_bytes());
    b
}

/// The MSI-X vector ixgbevf uses for PF-to-VF mailbox ("other") causes.
pub const MAILBOX_VECTOR: u8 = 1;

/// EITR bits 11:3, the ITR interval field. Bits 2:0 are reserved: the
/// interval granularity is eight times finer than the counter, so the
/// hardware ignores them and the model reads them back as zero.
pub const EITR_INTERVAL_MASK: u32 = 0x0FF8;

/// The EITR field as written: interval plus the reserved low bits.
const EITR_FIELD_MASK: u32 = 0x0FFF;

/// EITR bit 31, CNT_WDIS: "counter write disable". When set, a write to EITR
/// updates the interval without rewriting the running ITR counter. ixgbevf
/// always sets it, and the model always behaves as if it were set, so the bit
/// is accepted and otherwise ignored.
pub const EITR_CNT_WDIS: u32 = 1 << 31;

/// Ethernet preamble (7 bytes), start-of-frame delimiter (1) and the minimum
/// inter-frame gap (12): the per-frame wire cost beyond the frame itself.
pub const ETH_WIRE_OVERHEAD_BYTES: u32 = 20;

/// The Ethernet frame check sequence (CRC-32). The 82599 strips it on receive
/// (`HLREG0.RXCRCSTRP`), so driver-visible lengths exclude it, but it still
/// occupies the wire.
pub const ETH_FCS_BYTES: u32 = 4;

/// The minimum Ethernet frame, FCS included; shorter frames are padded.
pub const ETH_MIN_FRAME_BYTES: u32 = 64;

/// What the platform must do after a NIC operation that may raise an
/// interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqAction {
    /// Nothing to do now.
    None,
    /// The MSI-X message to send now, through the IOMMU.
    Fire {
        /// The VF whose vector fired.
        vf: u16,
        /// The MSI-X vector within that VF.
        vector: u8,
        /// The remappable-format message: handle and source requester ID.
        msi: RemappableMsi,
    },
    /// Schedule `itr_check(vf, vector, gen)` at `at`.
    CheckAt {
        /// The VF whose ITR countdown is running.
        vf: u16,
        /// The MSI-X vector within that VF.
        vector: u8,
        /// When the countdown expires.
        at: Time,
        /// Generation token; a later re-arm makes earlier tokens stale.
        gen: u64,
    },
}

impl IrqAction {
    /// True for [`IrqAction::None`].
    pub fn is_none(&self) -> bool {
        matches!(self, IrqAction::None)
    }
}

/// The actions produced by one write to a multi-vector register (`VTEIMS`,
/// `VTEICS`): at most one per vector, in ascending vector order, `None`s
/// left out. Fixed capacity, so register writes never allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrqActions {
    actions: [IrqAction; MAX_VECTORS as usize],
    len: u8,
}

impl Default for IrqActions {
    fn default() -> Self {
        Self::new()
    }
}

impl IrqActions {
    /// An empty set.
    pub const fn new() -> Self {
        Self {
            actions: [IrqAction::None; MAX_VECTORS as usize],
            len: 0,
        }
    }

    /// Adds an action, dropping `None`. One action per vector can never
    /// exceed the capacity; should it, the extra is dropped rather than
    /// panicking.
    fn push(&mut self, action: IrqAction) {
        if action.is_none() {
            return;
        }
        if let Some(slot) = self.actions.get_mut(usize::from(self.len)) {
            *slot = action;
            self.len += 1;
        }
    }

    /// Number of actions (never counts `None`).
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// True when the write needs no platform action.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The actions as a slice, in ascending vector order.
    pub fn as_slice(&self) -> &[IrqAction] {
        &self.actions[..usize::from(self.len)]
    }

    /// Iterates over the actions.
    pub fn iter(&self) -> core::slice::Iter<'_, IrqAction> {
        self.as_slice().iter()
    }
}

impl IntoIterator for IrqActions {
    type Item = IrqAction;
    type IntoIter = core::iter::Take<core::array::IntoIter<IrqAction, { MAX_VECTORS as usize }>>;

    fn into_iter(self) -> Self::IntoIter {
        self.actions.into_iter().take(usize::from(self.len))
    }
}

impl<'a> IntoIterator for &'a IrqActions {
    type Item = &'a IrqAction;
    type IntoIter = core::slice::Iter<'a, IrqAction>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Static configuration of the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NicConfig {
    /// Number of virtual functions (at least 1).
    pub vfs: u16,
    /// Descriptors in each VF's RX ring (at least 2). The real part wants a
    /// multiple of 8 (ring length a multiple of 128 bytes); the model does
    /// not insist, so tests can use tiny rings.
    pub rx_ring_size: u16,
    /// MSI-X vectors per function: 1 to [`MAX_VECTORS_PER_VF`] with one
    /// queue pair; with more, at least `queues` and at most
    /// [`MAX_VECTORS`] (the PF's).
    pub vectors_per_vf: u8,
    /// Queue pairs per function, 1 to [`MAX_QUEUES`]; pair q interrupts on
    /// vector q, and with more than one the receive side scales (RSS).
    pub queues: u8,
    /// The addressing the RSS hash sees: flow f's client port is
    /// `client_port_base + f` ([`Frame::tuple_from`]).
    pub client_port_base: u16,
    /// Picoseconds per unit of the EITR interval field (bits 11:3).
    pub itr_unit_ps: u64,
    /// EITR value at reset for every vector.
    pub initial_eitr: u32,
    /// TXDCTL.WTHRESH of each VF's TX queue: completed descriptors are
    /// written back (and the queue's cause raised) once this many are
    /// pending, or when the vector's ITR countdown expires or it fires;
    /// 0 or 1 writes each back as it completes.
    pub tx_wthresh: u16,
}

impl Default for NicConfig {
    fn default() -> Self {
        Self {
            vfs: 1,
            rx_ring_size: 512,
            vectors_per_vf: 2,
            // 2.048 µs: the EITR interval granularity at 10 GbE link speed.
            itr_unit_ps: 2_048_000,
            initial_eitr: 0,
            tx_wthresh: 1,
            queues: 1,
            client_port_base: crate::hw::wire::EPHEMERAL_LOW,
        }
    }
}

/// A received frame as the driver will see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxPacket {
    /// Frame length in bytes without FCS (what the descriptor write-back
    /// reports).
    pub len: u32,
    /// When the frame finished arriving at the NIC.
    pub arrived: Time,
    /// The frame's headers (its flow and transport).
    pub frame: Frame,
}

impl RxPacket {
    /// Placeholder for descriptor slots that hold no packet.
    const EMPTY: RxPacket = RxPacket {
        len: 0,
        arrived: 0,
        frame: Frame {
            flow: 0,
            transport: crate::hw::wire::Transport::Udp { len: 0, seq: 0 },
            sent: 0,
            gso_size: 0,
        },
    };
}

/// Fate of a frame offered to a VF's RX queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written back into a hardware-owned descriptor.
    Queued,
    /// No hardware-owned descriptor was free; counted in `rx_missed`.
    Dropped,
}

/// Errors from NIC construction and register access. Every caller-supplied
/// index or value is checked; bad ones leave the NIC unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NicError {
    /// The configuration has no VFs.
    #[error("NIC configured with no VFs")]
    NoVfs,
    /// The number of requester IDs differs from the number of VFs.
    #[error("{got} requester IDs given for {vfs} VFs")]
    RequesterIds {
        /// Configured VFs.
        vfs: u16,
        /// Requester IDs supplied.
        got: usize,
    },
    /// The RX ring cannot hold a packet while keeping one descriptor back.
    #[error("RX ring of {0} descriptors: at least 2 are needed (one always stays with software)")]
    RingTooSmall(u16),
    /// The per-VF vector count is out of range.
    #[error("{0} MSI-X vectors per VF: must be 1 to {max}, or with several queues one per queue up to {all}", max = MAX_VECTORS_PER_VF, all = MAX_VECTORS)]
    VectorCount(u8),
    /// The queue count is out of range.
    #[error("{0} queue pairs: must be 1 to {max}", max = MAX_QUEUES)]
    QueueCount(u8),
    /// The queue index does not exist.
    #[error("function {vf} has no queue {queue} (it has {queues})")]
    BadQueue {
        /// The function.
        vf: u16,
        /// Requested queue.
        queue: u8,
        /// Its queues.
        queues: u8,
    },
    /// A redirection-table entry names a queue the function does not have.
    #[error("RETA entry {index} names queue {queue}, but the function has {queues}")]
    RetaEntry {
        /// The entry.
        index: usize,
        /// The queue it names.
        queue: u8,
        /// Queues configured.
        queues: u8,
    },
    /// The VF index does not exist.
    #[error("VF {vf} does not exist (the NIC has {vfs})")]
    BadVf {
        /// Requested VF.
        vf: u16,
        /// Configured VFs.
        vfs: u16,
    },
    /// The vector index does not exist.
    #[error("VF {vf} has no MSI-X vector {vector} (it has {vectors})")]
    BadVector {
        /// The VF.
        vf: u16,
        /// Requested vector.
        vector: u8,
        /// Vectors per VF.
        vectors: u8,
    },
    /// A write to an interrupt mask/cause register sets bits for vectors
    /// the VF does not have.
    #[error(
        "interrupt register write {bits:#x} to VF {vf} sets bits beyond its {vectors} vectors"
    )]
    BadVectorBits {
        /// The VF.
        vf: u16,
        /// Bits written.
        bits: u32,
        /// Vectors per VF.
        vectors: u8,
    },
    /// An EITR value sets bits the model does not implement.
    #[error("EITR value {0:#x} sets bits outside 11:0 and CNT_WDIS (LLI and counter writes are not modelled)")]
    EitrValue(u32),
    /// The driver tried to give back more descriptors than it has cleaned.
    #[error(
        "VF {vf}: refill of {requested} descriptors, but only {cleaned} are cleaned and unreturned"
    )]
    RefillExceedsCleaned {
        /// The VF.
        vf: u16,
        /// Descriptors offered back.
        requested: u16,
        /// Descriptors cleaned and not yet returned.
        cleaned: usize,
    },
}

/// Per-VF statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VfCounters {
    /// Frames written back into the RX ring.
    pub rx_packets: u64,
    /// Bytes of those frames (FCS excluded).
    pub rx_bytes: u64,
    /// Frames dropped for lack of a hardware-owned descriptor.
    pub rx_missed: u64,
    /// Written-back descriptors the driver has cleaned (`rx_poll`).
    pub rx_cleaned: u64,
    /// MSI-X messages sent, all vectors.
    pub interrupts: u64,
    /// Of those, messages that the ITR interval held back at least once.
    pub itr_deferred: u64,
    /// Times a vector met every firing condition but had no MSI-X entry
    /// programmed, so no message could be sent.
    pub unprogrammed: u64,
    /// Frames transmitted from the TX ring.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
}

/// A TX queue of a function: descriptors the driver wrote (software-owned
/// until the TDT doorbell), descriptors the hardware owns (each leaves the
/// wire in order after the one before), and written-back descriptors
/// waiting for the driver's clean-up. Its write-back raises its queue
/// pair's vector's cause (queue 0: [`RX_QUEUE_VECTOR`]): the drivers map a
/// queue pair to one vector.
#[derive(Clone, Debug)]
struct TxRing {
    size: u16,
    /// Written by the driver, tail not yet bumped.
    staged: VecDeque<Frame>,
    /// Hardware-owned: (departure of its last bit, frame).
    hw: VecDeque<(Time, Frame)>,
    /// Written back, not yet cleaned by the driver.
    done: u16,
    /// Sent, not yet written back (below WTHRESH).
    unwritten: u16,
    /// When the pending write-back is due at the latest (the ITR timer).
    wb_due: Option<Time>,
    /// When the MAC finishes the frame it is sending.
    wire_free: Time,
}

impl TxRing {
    fn new(size: u16) -> Self {
        TxRing {
            size,
            staged: VecDeque::with_capacity(size as usize),
            hw: VecDeque::with_capacity(size as usize),
            done: 0,
            unwritten: 0,
            wb_due: None,
            wire_free: 0,
        }
    }

    fn used(&self) -> usize {
        self.staged.len() + self.hw.len() + self.unwritten as usize + self.done as usize
    }

    /// Writes back every completed descriptor; whether there were any.
    fn write_back(&mut self) -> bool {
        self.wb_due = None;
        let any = self.unwritten > 0;
        self.done += std::mem::take(&mut self.unwritten);
        any
    }
}

/// Interrupt state of one MSI-X vector.
#[derive(Clone, Copy, Debug)]
struct Vector {
    /// Remapping handle in the MSI-X table entry; `None` until programmed.
    handle: Option<u16>,
    /// MSI-X Vector Control mask bit.
    msix_masked: bool,
    /// EITR register, interval field only.
    eitr: u32,
    /// `VTEIMS` bit.
    enabled: bool,
    /// `VTEIAM` bit.
    auto_mask: bool,
    /// `VTEICR` bit.
    cause: bool,
    /// When the vector last sent its message.
    last_fire: Option<Time>,
    /// Expiry of the armed ITR countdown, if one is outstanding.
    armed_at: Option<Time>,
    /// Generation of the latest `CheckAt` handed out.
    gen: u64,
    /// The pending interrupt has been held back by the interval.
    deferred: bool,
}

impl Vector {
    fn reset(eitr: u32) -> Self {
        Self {
            handle: None,
            msix_masked: false,
            eitr,
            enabled: true,
            auto_mask: true,
            cause: false,
            last_fire: None,
            armed_at: None,
            gen: 0,
            deferred: false,
        }
    }

    fn interval(&self, itr_unit_ps: u64) -> Time {
        u64::from(self.eitr >> 3).saturating_mul(itr_unit_ps)
    }
}

/// One VF's RX descriptor ring.
///
/// Descriptors move round the ring through three owners, in order: hardware
/// (empty, between RDH and RDT), written back (done, awaiting the driver's
/// clean), and cleaned (buffer consumed, awaiting the driver's refill, which
/// bumps RDT). The datasheet's "Receive Descriptor Tail" rule that RDH == RDT
/// means "no descriptors for hardware" forces one descriptor to stay with
/// software, so the three counts always sum to `size - 1`.
#[derive(Clone, Debug)]
struct Ring {
    /// The packet written back into each descriptor.
    slots: Box<[RxPacket]>,
    /// RDH: next descriptor hardware writes back.
    head: usize,
    /// Driver's next_to_clean.
    next_to_clean: usize,
    /// Hardware-owned, empty descriptors (RDT - RDH).
    hw_free: usize,
    /// Written back, not yet cleaned.
    pending: usize,
    /// Cleaned, not yet returned by a tail bump.
    cleaned: usize,
    /// Frames written back into this ring.
    received: u64,
}

impl Ring {
    fn new(size: u16) -> Self {
        let size = usize::from(size);
        Self {
            slots: vec![RxPacket::EMPTY; size].into_boxed_slice(),
            head: 0,
            next_to_clean: 0,
            // The driver's initial refill gives all but one to hardware.
            hw_free: size - 1,
            pending: 0,
            cleaned: 0,
            received: 0,
        }
    }

    fn advance(&self, index: usize) -> usize {
        if index + 1 == self.slots.len() {
            0
        } else {
            index + 1
        }
    }
}

/// The RSS registers of a function: the hash key (`RSSRK`) and the
/// redirection table (`RETA`).
#[derive(Clone, Debug)]
struct Rss {
    key: [u8; RSS_KEY_BYTES],
    reta: [u8; RETA_ENTRIES],
}

/// One virtual function.
#[derive(Clone, Debug)]
struct Vf {
    requester_id: u16,
    /// RX ring of each queue pair.
    rings: Box<[Ring]>,
    /// TX ring of each queue pair.
    tx: Box<[TxRing]>,
    vectors: [Vector; MAX_VECTORS as usize],
    /// RSS, once the driver enabled it (`MRQC`); queue 0 until then.
    rss: Option<Rss>,
    counters: VfCounters,
}

impl Vf {
    /// Applies the moderation rule to one vector (82599 "Interrupt
    /// Moderation"): fire if cause, enable, MSI-X unmask and the EITR
    /// interval all hold; if only the interval is missing, arm the countdown.
    fn evaluate(&mut self, vf: u16, vector: u8, itr_unit_ps: u64, now: Time) -> IrqAction {
        let requester_id = self.requester_id;
        let Some(v) = self.vectors.get_mut(usize::from(vector)) else {
            return IrqAction::None;
        };
        if !v.cause || !v.enabled || v.msix_masked {
            // A masked vector keeps its cause latched (EICR, and the MSI-X
            // pending bit): unmasking re-evaluates.
            return IrqAction::None;
        }
        if let Some(last) = v.last_fire {
            let due = last.saturating_add(v.interval(itr_unit_ps));
            if now < due {
                v.deferred = true;
                if v.armed_at == Some(due) {
                    // The countdown already running covers this cause; no
                    // second event per packet.
                    return IrqAction::None;
                }
                v.gen = v.gen.wrapping_add(1);
                v.armed_at = Some(due);
                return IrqAction::CheckAt {
                    vf,
                    vector,
                    at: due,
                    gen: v.gen,
                };
            }
        }
        let Some(handle) = v.handle else {
            // No message address/data yet: the write cannot be formed. The
            // cause stays latched for when the entry is programmed.
            self.counters.unprogrammed += 1;
            return IrqAction::None;
        };
        // Firing: EIAC-style auto-clear of the cause, EIAM auto-mask (the
        // EIMS bit drops, so NAPI polls with the vector masked), and the
        // ITR interval restarts from now.
        v.cause = false;
        if v.auto_mask {
            v.enabled = false;
        }
        v.last_fire = Some(now);
        v.armed_at = None;
        if let Some(tx) = self.tx.get_mut(usize::from(vector)) {
            // Pending TX write-backs of its queue go out with the interrupt.
            tx.write_back();
        }
        self.counters.interrupts += 1;
        if v.deferred {
            self.counters.itr_deferred += 1;
            v.deferred = false;
        }
        IrqAction::Fire {
            vf,
            vector,
            msi: RemappableMsi {
                handle,
                requester_id,
            },
        }
    }
}

/// The 82599-class NIC: its VFs' RX rings and MSI-X interrupt state.
#[derive(Clone, Debug)]
pub struct Nic {
    cfg: NicConfig,
    vfs: Box<[Vf]>,
    /// When the port's transmit side is next free: every VF (and the PF,
    /// for the host's bridged traffic) sends through the one port.
    port_tx_free: Time,
}

/// Checks an EITR write and returns the stored field.
fn eitr_field(value: u32) -> Result<u32, NicError> {
    if value & !(EITR_FIELD_MASK | EITR_CNT_WDIS) != 0 {
        return Err(NicError::EitrValue(value));
    }
    Ok(value & EITR_INTERVAL_MASK)
}

impl Nic {
    /// Builds the NIC with one PCIe requester ID (bus/device/function) per VF,
    /// in the reset state described in the module documentation.
    pub fn new(cfg: NicConfig, requester_ids: &[u16]) -> Result<Self, NicError> {
        if cfg.vfs == 0 {
            return Err(NicError::NoVfs);
        }
        if requester_ids.len() != usize::from(cfg.vfs) {
            return Err(NicError::RequesterIds {
                vfs: cfg.vfs,
                got: requester_ids.len(),
            });
        }
        if cfg.rx_ring_size < 2 {
            return Err(NicError::RingTooSmall(cfg.rx_ring_size));
        }
        if cfg.queues == 0 || cfg.queues > MAX_QUEUES {
            return Err(NicError::QueueCount(cfg.queues));
        }
        let most = if cfg.queues > 1 {
            MAX_VECTORS
        } else {
            MAX_VECTORS_PER_VF
        };
        if cfg.vectors_per_vf == 0 || cfg.vectors_per_vf > most || cfg.vectors_per_vf < cfg.queues {
            return Err(NicError::VectorCount(cfg.vectors_per_vf));
        }
        let eitr = eitr_field(cfg.initial_eitr)?;
        let vfs = requester_ids
            .iter()
            .map(|&requester_id| Vf {
                requester_id,
                rings: (0..cfg.queues)
                    .map(|_| Ring::new(cfg.rx_ring_size))
                    .collect(),
                tx: (0..cfg.queues)
                    .map(|_| TxRing::new(cfg.rx_ring_size))
                    .collect(),
                vectors: [Vector::reset(eitr); MAX_VECTORS as usize],
                rss: None,
                counters: VfCounters::default(),
            })
            .collect();
        Ok(Self {
            cfg,
            vfs,
            port_tx_free: 0,
        })
    }

    /// The configuration the NIC was built with.
    pub fn config(&self) -> &NicConfig {
        &self.cfg
    }

    fn vf(&self, vf: u16) -> Result<&Vf, NicError> {
        self.vfs.get(usize::from(vf)).ok_or(NicError::BadVf {
            vf,
            vfs: self.cfg.vfs,
        })
    }

    fn vf_mut(&mut self, vf: u16) -> Result<&mut Vf, NicError> {
        let vfs = self.cfg.vfs;
        self.vfs
            .get_mut(usize::from(vf))
            .ok_or(NicError::BadVf { vf, vfs })
    }

    fn check_vector(&self, vf: u16, vector: u8) -> Result<(), NicError> {
        self.vf(vf)?;
        if vector >= self.cfg.vectors_per_vf {
            return Err(NicError::BadVector {
                vf,
                vector,
                vectors: self.cfg.vectors_per_vf,
            });
        }
        Ok(())
    }

    fn vector(&self, vf: u16, vector: u8) -> Result<&Vector, NicError> {
        self.check_vector(vf, vector)?;
        Ok(&self.vf(vf)?.vectors[usize::from(vector)])
    }

    fn vector_mut(&mut self, vf: u16, vector: u8) -> Result<&mut Vector, NicError> {
        self.check_vector(vf, vector)?;
        Ok(&mut self.vf_mut(vf)?.vectors[usize::from(vector)])
    }

    /// Checks a per-vector bitmask register write against the VF's vectors.
    fn check_bits(&self, vf: u16, bits: u32) -> Result<(), NicError> {
        self.vf(vf)?;
        let valid = (1u32 << self.cfg.vectors_per_vf) - 1;
        if bits & !valid != 0 {
            return Err(NicError::BadVectorBits {
                vf,
                bits,
                vectors: self.cfg.vectors_per_vf,
            });
        }
        Ok(())
    }

    /// Runs the moderation rule for a vector whose indexes were checked.
    fn evaluate(&mut self, vf: u16, vector: u8, now: Time) -> IrqAction {
        let unit = self.cfg.itr_unit_ps;
        match self.vfs.get_mut(usize::from(vf)) {
            Some(state) => state.evaluate(vf, vector, unit, now),
            None => IrqAction::None,
        }
    }

    /// The VF's PCIe requester ID, the source ID its MSI writes carry.
    pub fn requester_id(&self, vf: u16) -> Result<u16, NicError> {
        Ok(self.vf(vf)?.requester_id)
    }

    /// Writes a vector's MSI-X table entry (address/data in remappable
    /// format, reduced to the remapping handle). The mask bit is untouched,
    /// and a latched cause is not re-evaluated: like the host kernel, mask
    /// the entry, program it, then unmask with [`Nic::set_msix_masked`].
    pub fn program_msix(&mut self, vf: u16, vector: u8, handle: u16) -> Result<(), NicError> {
        self.vector_mut(vf, vector)?.handle = Some(handle);
        Ok(())
    }

    /// Sets a vector's MSI-X Vector Control mask bit. Unmasking with a cause
    /// latched re-evaluates the rule, as the MSI-X pending bit makes the
    /// device send the held message when the mask clears.
    pub fn set_msix_masked(
        &mut self,
        vf: u16,
        vector: u8,
        masked: bool,
        now: Time,
    ) -> Result<IrqAction, NicError> {
        self.vector_mut(vf, vector)?.msix_masked = masked;
        if masked {
            return Ok(IrqAction::None);
        }
        Ok(self.evaluate(vf, vector, now))
    }

    /// Whether a vector's MSI-X entry is masked.
    pub fn msix_masked(&self, vf: u16, vector: u8) -> Result<bool, NicError> {
        Ok(self.vector(vf, vector)?.msix_masked)
    }

    /// The driver's RSS set-up (`ixgbe_setup_mrqc`): writes the hash key
    /// (`RSSRK`) and the redirection table (`RETA`), and enables RSS in
    /// `MRQC`. Every entry must name one of the function's queues; on an
    /// error nothing changes.
    pub fn configure_rss(
        &mut self,
        vf: u16,
        key: &[u8; RSS_KEY_BYTES],
        reta: &[u8; RETA_ENTRIES],
    ) -> Result<(), NicError> {
        let queues = self.cfg.queues;
        if let Some((index, &queue)) = reta.iter().enumerate().find(|(_, &q)| q >= queues) {
            return Err(NicError::RetaEntry {
                index,
                queue,
                queues,
            });
        }
        self.vf_mut(vf)?.rss = Some(Rss {
            key: *key,
            reta: *reta,
        });
        Ok(())
    }

    /// The RSS hash the NIC computes for `frame` under function `vf`'s
    /// key (§7.1.2.8): over the TCP/IPv4 4-tuple, or the address pair for
    /// other frames; `None` while RSS is off.
    pub fn rss_hash(&self, vf: u16, frame: &Frame) -> Result<Option<u32>, NicError> {
        let Some(rss) = &self.vf(vf)?.rss else {
            return Ok(None);
        };
        let input = rss_input(&frame.tuple_from(self.cfg.client_port_base));
        let n = match frame.transport {
            crate::hw::wire::Transport::Tcp(_) => 12,
            _ => 8,
        };
        Ok(Some(toeplitz(&rss.key, &input[..n])))
    }

    /// The RX queue a frame to function `vf` lands in: the redirection
    /// table's entry at the hash's seven low bits, or queue 0 without RSS.
    pub fn rx_queue_of(&self, vf: u16, frame: &Frame) -> Result<u8, NicError> {
        let Some(hash) = self.rss_hash(vf, frame)? else {
            return Ok(0);
        };
        let reta = &self.vf(vf)?.rss.as_ref().map(|r| r.reta);
        Ok(reta.map_or(0, |t| t[(hash as usize) & (RETA_ENTRIES - 1)]))
    }

    /// A frame arrives for the function: RSS picks its RX queue (queue 0,
    /// mapped to [`RX_QUEUE_VECTOR`], with one queue). It takes that ring's
    /// descriptor at RDH if hardware owns one, else it is dropped (the
    /// datasheet's missed-packets count). A write-back sets the queue's
    /// cause bit and evaluates its vector.
    pub fn receive(
        &mut self,
        vf: u16,
        pkt: RxPacket,
        now: Time,
    ) -> Result<(RxOutcome, IrqAction), NicError> {
        let queue = if self.cfg.queues > 1 {
            self.rx_queue_of(vf, &pkt.frame)?
        } else {
            0
        };
        let state = self.vf_mut(vf)?;
        let ring = &mut state.rings[usize::from(queue)];
        if ring.hw_free == 0 {
            state.counters.rx_missed += 1;
            return Ok((RxOutcome::Dropped, IrqAction::None));
        }
        ring.slots[ring.head] = pkt;
        ring.head = ring.advance(ring.head);
        ring.hw_free -= 1;
        ring.pending += 1;
        ring.received += 1;
        state.counters.rx_packets += 1;
        state.counters.rx_bytes += u64::from(pkt.len);
        state.vectors[usize::from(queue)].cause = true;
        Ok((RxOutcome::Queued, self.evaluate(vf, queue, now)))
    }

    /// Checks a queue index of function `vf`.
    fn check_queue(&self, vf: u16, queue: u8) -> Result<(), NicError> {
        self.vf(vf)?;
        if queue >= self.cfg.queues {
            return Err(NicError::BadQueue {
                vf,
                queue,
                queues: self.cfg.queues,
            });
        }
        Ok(())
    }

    fn ring(&self, vf: u16, queue: u8) -> Result<&Ring, NicError> {
        self.check_queue(vf, queue)?;
        Ok(&self.vf(vf)?.rings[usize::from(queue)])
    }

    /// The driver writes a TX descriptor for `frame` on queue 0; see
    /// [`Nic::tx_enqueue_on`].
    pub fn tx_enqueue(&mut self, vf: u16, frame: Frame) -> Result<bool, NicError> {
        self.tx_enqueue_on(vf, 0, frame)
    }

    /// The driver writes a TX descriptor for `frame` on TX queue `queue`
    /// (in DMA memory: no doorbell yet). False when the ring has no free
    /// descriptor (one always stays with software, as on RX).
    pub fn tx_enqueue_on(&mut self, vf: u16, queue: u8, frame: Frame) -> Result<bool, NicError> {
        self.check_queue(vf, queue)?;
        let t = &mut self.vf_mut(vf)?.tx[usize::from(queue)];
        if t.used() + 1 >= t.size as usize {
            return Ok(false);
        }
        t.staged.push_back(frame);
        Ok(true)
    }

    /// The PF sends frame `f` ready at `at` (the host's own, bridged
    /// traffic) on the shared port: when its last bit leaves. A GSO packet
    /// leaves as its train of frames (TSO).
    pub fn pf_transmit(&mut self, at: Time, f: &Frame, link: &Link) -> Time {
        let start = at.max(self.port_tx_free);
        let end = start.saturating_add(link.frame_wire_time(f));
        self.port_tx_free = end;
        end
    }

    /// The driver's TDT write: staged descriptors pass to the hardware,
    /// which fetches each (`fetch` after the doorbell) and sends it on
    /// `link` when the wire is free, back to back. Returns the departure
    /// time of the head frame if the hardware queue was idle, i.e. when the
    /// platform must next call [`tx_complete`](Self::tx_complete).
    pub fn tx_doorbell(
        &mut self,
        vf: u16,
        now: Time,
        fetch: Time,
        link: &Link,
    ) -> Result<Option<Time>, NicError> {
        self.tx_doorbell_on(vf, 0, now, fetch, link)
    }

    /// [`Nic::tx_doorbell`] for TX queue `queue` (its `TDT`): the queues
    /// share the port's wire.
    pub fn tx_doorbell_on(
        &mut self,
        vf: u16,
        queue: u8,
        now: Time,
        fetch: Time,
        link: &Link,
    ) -> Result<Option<Time>, NicError> {
        self.check_queue(vf, queue)?;
        let mut port = self.port_tx_free;
        let t = &mut self.vf_mut(vf)?.tx[usize::from(queue)];
        let was_idle = t.hw.is_empty();
        while let Some(f) = t.staged.pop_front() {
            // One port: the VFs' queues share its wire.
            let start = t.wire_free.max(port).max(now + fetch);
            // A TSO descriptor leaves as its train of frames.
            let end = start.saturating_add(link.frame_wire_time(&f));
            t.wire_free = end;
            port = end;
            t.hw.push_back((end, f));
        }
        let head = if was_idle {
            t.hw.front().map(|h| h.0)
        } else {
            None
        };
        self.port_tx_free = port;
        Ok(head)
    }

    /// The head TX frame has left the wire: its descriptor is written back
    /// and the queue's cause is raised. Returns the frame, the interrupt
    /// decision and the next frame's departure time.
    pub fn tx_complete(
        &mut self,
        vf: u16,
        now: Time,
    ) -> Result<(Option<Frame>, IrqAction, Option<Time>), NicError> {
        self.tx_complete_on(vf, 0, now)
    }

    /// [`Nic::tx_complete`] for TX queue `queue`, whose write-back raises
    /// its queue pair's vector.
    pub fn tx_complete_on(
        &mut self,
        vf: u16,
        queue: u8,
        now: Time,
    ) -> Result<(Option<Frame>, IrqAction, Option<Time>), NicError> {
        self.check_queue(vf, queue)?;
        let q = usize::from(queue);
        let state = self.vf_mut(vf)?;
        let Some((_, f)) = state.tx[q].hw.pop_front() else {
            return Ok((None, IrqAction::None, None));
        };
        state.tx[q].unwritten += 1;
        state.counters.tx_packets += 1;
        state.counters.tx_bytes += u64::from(f.len());
        let next = state.tx[q].hw.front().map(|h| h.0);
        let wthresh = self.cfg.tx_wthresh.max(1);
        let unit = self.cfg.itr_unit_ps;
        let state = self.vf_mut(vf)?;
        if state.tx[q].unwritten >= wthresh {
            state.tx[q].write_back();
            state.vectors[q].cause = true;
            return Ok((Some(f), self.evaluate(vf, queue, now), next));
        }
        // Below WTHRESH the descriptors wait for the ITR timer, which the
        // first held descriptor starts (82598EB datasheet §3.5.3.3.4: "the
        // first packet after timer initialization starts the timer; timer
        // expiration flushes any accumulated descriptors and sets an
        // interrupt event"); an interrupt of the vector before then takes
        // them along.
        if state.tx[q].wb_due.is_some() {
            return Ok((Some(f), IrqAction::None, next));
        }
        let v = &mut state.vectors[q];
        let due = now.saturating_add(v.interval(unit));
        if due <= now {
            // No interval: written back at once.
            state.tx[q].write_back();
            state.vectors[q].cause = true;
            return Ok((Some(f), self.evaluate(vf, queue, now), next));
        }
        state.tx[q].wb_due = Some(due);
        if v.armed_at.is_some_and(|a| a <= due) {
            // A countdown already running ends first; its fire takes them.
            return Ok((Some(f), IrqAction::None, next));
        }
        v.gen = v.gen.wrapping_add(1);
        v.armed_at = Some(due);
        let gen = v.gen;
        let vector = queue;
        Ok((
            Some(f),
            IrqAction::CheckAt {
                vf,
                vector,
                at: due,
                gen,
            },
            next,
        ))
    }

    /// The driver's TX clean-up (`ixgbevf_clean_tx_irq`): reclaims
    /// written-back descriptors; returns how many.
    pub fn tx_clean(&mut self, vf: u16) -> Result<u16, NicError> {
        self.tx_clean_on(vf, 0)
    }

    /// [`Nic::tx_clean`] of TX queue `queue`.
    pub fn tx_clean_on(&mut self, vf: u16, queue: u8) -> Result<u16, NicError> {
        self.check_queue(vf, queue)?;
        let t = &mut self.vf_mut(vf)?.tx[usize::from(queue)];
        Ok(std::mem::take(&mut t.done))
    }

    /// The platform's event for an armed ITR countdown. A `gen` other than
    /// the latest one handed out for the vector, or one whose countdown has
    /// since been resolved by a fire, is stale and does nothing.
    pub fn itr_check(
        &mut self,
        vf: u16,
        vector: u8,
        gen: u64,
        now: Time,
    ) -> Result<IrqAction, NicError> {
        let v = self.vector_mut(vf, vector)?;
        if v.armed_at.is_none() || v.gen != gen {
            return Ok(IrqAction::None);
        }
        v.armed_at = None;
        let q = usize::from(vector);
        let queue_vector = vector < self.cfg.queues;
        if queue_vector {
            // The ITR timer writes back what WTHRESH held.
            let state = self.vf_mut(vf)?;
            if state.tx[q].wb_due.is_some_and(|d| d <= now) && state.tx[q].write_back() {
                state.vectors[q].cause = true;
            }
        }
        let action = self.evaluate(vf, vector, now);
        if !matches!(action, IrqAction::None) || !queue_vector {
            return Ok(action);
        }
        // Nothing fired (the cause was masked, or this countdown was for
        // another cause): a write-back still held waits for its own timer.
        let state = self.vf_mut(vf)?;
        let Some(due) = state.tx[q].wb_due else {
            return Ok(action);
        };
        let v = &mut state.vectors[usize::from(vector)];
        if v.armed_at.is_some() {
            return Ok(action);
        }
        v.gen = v.gen.wrapping_add(1);
        v.armed_at = Some(due);
        let gen = v.gen;
        Ok(IrqAction::CheckAt {
            vf,
            vector,
            at: due,
            gen,
        })
    }

    /// Writes a vector's EITR. Bits 11:3 are the interval; bits 2:0 are
    /// reserved and read back as zero; bit 31 (CNT_WDIS) is accepted. Any
    /// other bit is an error. The model always has CNT_WDIS semantics: the
    /// running countdown is not restarted, the new interval is measured from
    /// the last fire. If a countdown is armed, the new deadline is applied
    /// at once: the vector may fire now, or a new `CheckAt` replaces the old
    /// one (whose `gen` becomes stale).
    pub fn write_eitr(
        &mut self,
        vf: u16,
        vector: u8,
        value: u32,
        now: Time,
    ) -> Result<IrqAction, NicError> {
        let field = eitr_field(value)?;
        let v = self.vector_mut(vf, vector)?;
        v.eitr = field;
        if v.armed_at.is_none() {
            return Ok(IrqAction::None);
        }
        Ok(self.evaluate(vf, vector, now))
    }

    /// A vector's EITR value (bits 11:0, reserved bits 2:0 as zero).
    pub fn eitr(&self, vf: u16, vector: u8) -> Result<u32, NicError> {
        Ok(self.vector(vf, vector)?.eitr)
    }

    /// A vector's minimum spacing between fires: `(EITR >> 3) *
    /// itr_unit_ps`; zero means no throttling.
    pub fn itr_interval(&self, vf: u16, vector: u8) -> Result<Time, NicError> {
        Ok(self.vector(vf, vector)?.interval(self.cfg.itr_unit_ps))
    }

    /// Sets one vector's `VTEIMS` bit and re-evaluates it: with a cause
    /// latched (packets arrived while NAPI polled with the vector
    /// auto-masked) it fires now or arms a `CheckAt`.
    pub fn enable_vector(&mut self, vf: u16, vector: u8, now: Time) -> Result<IrqAction, NicError> {
        self.vector_mut(vf, vector)?.enabled = true;
        Ok(self.evaluate(vf, vector, now))
    }

    /// Writes `VTEIMS`: sets the enable bit of every vector in `bits` (bit
    /// n = vector n) and re-evaluates each, as [`Nic::enable_vector`] does,
    /// in ascending order. Returns every resulting action. Bits beyond the
    /// VF's vectors are an error, and then nothing changes.
    pub fn write_eims(&mut self, vf: u16, bits: u32, now: Time) -> Result<IrqActions, NicError> {
        self.per_vector(vf, bits, now, Nic::enable_vector)
    }

    /// Applies a single-vector register operation to every vector whose bit
    /// is set in `bits`, in ascending order, collecting the actions.
    fn per_vector(
        &mut self,
        vf: u16,
        bits: u32,
        now: Time,
        op: fn(&mut Nic, u16, u8, Time) -> Result<IrqAction, NicError>,
    ) -> Result<IrqActions, NicError> {
        self.check_bits(vf, bits)?;
        let mut out = IrqActions::new();
        for vector in 0..self.cfg.vectors_per_vf {
            if bits & (1 << vector) != 0 {
                out.push(op(self, vf, vector, now)?);
            }
        }
        Ok(out)
    }

    /// Writes `VTEIMC`: clears the enable bit of every vector in `bits`.
    /// Latched causes and a running ITR countdown are kept; the countdown's
    /// check will find the vector disabled and do nothing.
    pub fn write_eimc(&mut self, vf: u16, bits: u32) -> Result<(), NicError> {
        self.check_bits(vf, bits)?;
        for vector in 0..self.cfg.vectors_per_vf {
            if bits & (1 << vector) != 0 {
                self.vector_mut(vf, vector)?.enabled = false;
            }
        }
        Ok(())
    }

    /// Sets one vector's cause as a `VTEICS` write would and evaluates it
    /// under the same moderation rule as a hardware cause.
    pub fn trigger_vector(
        &mut self,
        vf: u16,
        vector: u8,
        now: Time,
    ) -> Result<IrqAction, NicError> {
        self.vector_mut(vf, vector)?.cause = true;
        Ok(self.evaluate(vf, vector, now))
    }

    /// Writes `VTEICS`: sets the cause of every vector in `bits`, the way a
    /// driver kicks a vector from software, and evaluates each in ascending
    /// order. Bits beyond the VF's vectors are an error, and then nothing
    /// changes.
    pub fn write_eics(&mut self, vf: u16, bits: u32, now: Time) -> Result<IrqActions, NicError> {
        self.per_vector(vf, bits, now, Nic::trigger_vector)
    }

    /// Writes `VTEIAM`: vectors in `bits` auto-mask (drop their `VTEIMS`
    /// bit) when they fire; the others stay enabled. All are set at reset,
    /// as ixgbevf programs it.
    pub fn write_eiam(&mut self, vf: u16, bits: u32) -> Result<(), NicError> {
        self.check_bits(vf, bits)?;
        for vector in 0..self.cfg.vectors_per_vf {
            self.vector_mut(vf, vector)?.auto_mask = bits & (1 << vector) != 0;
        }
        Ok(())
    }

    /// Whether the vector's `VTEIMS` bit is set.
    pub fn vector_enabled(&self, vf: u16, vector: u8) -> Result<bool, NicError> {
        Ok(self.vector(vf, vector)?.enabled)
    }

    /// Whether the vector's cause bit (`VTEICR`) is latched. Reading does
    /// not clear it (unlike a real EICR read).
    pub fn cause_pending(&self, vf: u16, vector: u8) -> Result<bool, NicError> {
        Ok(self.vector(vf, vector)?.cause)
    }

    /// The expiry of the vector's armed ITR countdown, if any.
    pub fn itr_armed(&self, vf: u16, vector: u8) -> Result<Option<Time>, NicError> {
        Ok(self.vector(vf, vector)?.armed_at)
    }

    /// Descriptors written back and not yet cleaned by the driver.
    pub fn rx_pending(&self, vf: u16) -> Result<usize, NicError> {
        self.rx_pending_on(vf, 0)
    }

    /// [`Nic::rx_pending`] of RX queue `queue`.
    pub fn rx_pending_on(&self, vf: u16, queue: u8) -> Result<usize, NicError> {
        Ok(self.ring(vf, queue)?.pending)
    }

    /// Frames written back into RX queue `queue` since the NIC was built.
    pub fn rx_queue_packets(&self, vf: u16, queue: u8) -> Result<u64, NicError> {
        Ok(self.ring(vf, queue)?.received)
    }

    /// The driver cleans the next written-back descriptor, in ring order.
    /// Its buffer stays with the driver until [`Nic::rx_refill`].
    pub fn rx_poll(&mut self, vf: u16) -> Result<Option<RxPacket>, NicError> {
        self.rx_poll_on(vf, 0)
    }

    /// [`Nic::rx_poll`] of RX queue `queue`.
    pub fn rx_poll_on(&mut self, vf: u16, queue: u8) -> Result<Option<RxPacket>, NicError> {
        self.check_queue(vf, queue)?;
        let state = self.vf_mut(vf)?;
        let ring = &mut state.rings[usize::from(queue)];
        if ring.pending == 0 {
            return Ok(None);
        }
        let pkt = ring.slots[ring.next_to_clean];
        ring.next_to_clean = ring.advance(ring.next_to_clean);
        ring.pending -= 1;
        ring.cleaned += 1;
        state.counters.rx_cleaned += 1;
        Ok(Some(pkt))
    }

    /// The driver returns `n` cleaned descriptors to hardware by bumping
    /// RDT. More than are cleaned and unreturned is an error (it would move
    /// RDT past RDH and hand hardware descriptors it is still writing
    /// back), and then nothing changes.
    pub fn rx_refill(&mut self, vf: u16, n: u16) -> Result<(), NicError> {
        self.rx_refill_on(vf, 0, n)
    }

    /// [`Nic::rx_refill`] of RX queue `queue` (its `RDT`).
    pub fn rx_refill_on(&mut self, vf: u16, queue: u8, n: u16) -> Result<(), NicError> {
        self.check_queue(vf, queue)?;
        let ring = &mut self.vf_mut(vf)?.rings[usize::from(queue)];
        let n_usize = usize::from(n);
        if n_usize > ring.cleaned {
            return Err(NicError::RefillExceedsCleaned {
                vf,
                requested: n,
                cleaned: ring.cleaned,
            });
        }
        ring.cleaned -= n_usize;
        ring.hw_free += n_usize;
        Ok(())
    }

    /// Hardware-owned empty descriptors (RDT - RDH, modulo the ring).
    pub fn rx_free_descriptors(&self, vf: u16) -> Result<usize, NicError> {
        Ok(self.ring(vf, 0)?.hw_free)
    }

    /// Descriptors cleaned by the driver and not yet given back.
    pub fn rx_awaiting_refill(&self, vf: u16) -> Result<usize, NicError> {
        Ok(self.ring(vf, 0)?.cleaned)
    }

    /// The ring's `(RDH, RDT)` register values. Hardware owns the
    /// descriptors from RDH up to, not including, RDT.
    pub fn rx_ring_pointers(&self, vf: u16) -> Result<(u16, u16), NicError> {
        let ring = self.ring(vf, 0)?;
        let size = ring.slots.len();
        let tail = (ring.head + ring.hw_free) % size;
        // Both indexes are below rx_ring_size, itself a u16.
        Ok((
            u16::try_from(ring.head).unwrap_or(u16::MAX),
            u16::try_from(tail).unwrap_or(u16::MAX),
        ))
    }

    /// The VF's statistics.
    pub fn counters(&self, vf: u16) -> Result<VfCounters, NicError> {
        Ok(self.vf(vf)?.counters)
    }
}

/// A point-to-point Ethernet link delivering frames to the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Link {
    /// Line rate in bits per second.
    pub bits_per_sec: u64,
    /// One-way propagation delay in picoseconds.
    pub propagation_ps: u64,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            bits_per_sec: 10_000_000_000,
            propagation_ps: 500_000,
        }
    }
}

impl Link {
    /// Time a frame occupies the wire, i.e. the minimum spacing of
    /// back-to-back frames.
    ///
    /// `frame_bytes` is the frame as the driver sees it: Ethernet header and
    /// payload, FCS stripped. The bytes on the wire are
    /// `max(frame_bytes + 4, 64) + 20`: the 4-byte FCS, padding up to the
    /// 64-byte minimum frame, and 20 bytes of preamble (7), SFD (1) and
    /// inter-frame gap (12). The time is `bytes * 8 * 10^12 / bits_per_sec`
    /// picoseconds, rounded up since the frame is not done until its last
    /// bit is. At 10 Gb/s a byte is 800 ps, so a 60-byte frame takes
    /// 84 * 800 = 67.2 ns and a 1514-byte one 1538 * 800 = 1230.4 ns. A link
    /// with zero bandwidth never finishes: `Time::MAX`.
    pub fn wire_time(&self, frame_bytes: u32) -> Time {
        if self.bits_per_sec == 0 {
            return Time::MAX;
        }
        let frame =
            (u64::from(frame_bytes) + u64::from(ETH_FCS_BYTES)).max(u64::from(ETH_MIN_FRAME_BYTES));
        let wire_bytes = frame + u64::from(ETH_WIRE_OVERHEAD_BYTES);
        // u128: bits * 10^12 overflows u64 beyond ~2.3 MB frames.
        let bit_ps = u128::from(wire_bytes) * 8 * u128::from(SEC);
        let rate = u128::from(self.bits_per_sec);
        Time::try_from(bit_ps.div_ceil(rate)).unwrap_or(Time::MAX)
    }

    /// Wire time of `f`: of its one frame, or of a GSO packet's train of
    /// frames back to back (TSO or the host stack's GSO cut it; each frame
    /// carries its own headers).
    pub fn frame_wire_time(&self, f: &Frame) -> Time {
        let n = f.gso_segs();
        if n == 1 {
            return self.wire_time(f.len());
        }
        let full = self.wire_time(f.gso_segment(0).len());
        let last = self.wire_time(f.gso_segment(n - 1).len());
        full.saturating_mul(Time::from(n - 1)).saturating_add(last)
    }

    /// From the first bit leaving the sender to the last bit reaching the
    /// NIC: wire time plus propagation.
    pub fn delivery_time(&self, frame_bytes: u32) -> Time {
        self.wire_time(frame_bytes)
            .saturating_add(self.propagation_ps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{NS, US};
    use proptest::prelude::*;

    const RID: u16 = 0x0310;
    /// EITR 200: interval field 25, 25 * 2.048 µs = 51.2 µs (ixgbevf's
    /// 20K ints/s setting).
    const EITR_20K: u32 = 200;
    const INTERVAL_20K: Time = 51_200_000;

    fn pkt(seq: u64, now: Time) -> RxPacket {
        RxPacket {
            len: 1514,
            arrived: now,
            frame: Frame {
                flow: 7,
                transport: crate::hw::wire::Transport::Udp { len: 1472, seq },
                sent: now,
                gso_size: 0,
            },
        }
    }

    fn seq_of(p: RxPacket) -> u64 {
        match p.frame.transport {
            crate::hw::wire::Transport::Udp { seq, .. } => seq,
            crate::hw::wire::Transport::Tcp(s) => s.seq,
            crate::hw::wire::Transport::Icmp { seq, .. } => seq,
        }
    }

    fn nic_with(cfg: NicConfig) -> Nic {
        let rids: Vec<u16> = (0..cfg.vfs).map(|i| RID + i).collect();
        let mut nic = Nic::new(cfg, &rids).unwrap();
        for vf in 0..cfg.vfs {
            for vector in 0..cfg.vectors_per_vf {
                nic.program_msix(vf, vector, 100 + u16::from(vector))
                    .unwrap();
            }
        }
        nic
    }

    fn nic(eitr: u32) -> Nic {
        nic_with(NicConfig {
            initial_eitr: eitr,
            ..NicConfig::default()
        })
    }

    fn is_fire(a: IrqAction) -> bool {
        matches!(a, IrqAction::Fire { .. })
    }

    #[test]
    fn defaults() {
        let cfg = NicConfig::default();
        assert_eq!(cfg.vfs, 1);
        assert_eq!(cfg.rx_ring_size, 512);
        assert_eq!(cfg.vectors_per_vf, 2);
        assert_eq!(cfg.itr_unit_ps, 2_048_000);
        assert_eq!(cfg.initial_eitr, 0);
        let n = nic(0);
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 511);
        assert_eq!(n.rx_ring_pointers(0).unwrap(), (0, 511));
        assert!(n.vector_enabled(0, 0).unwrap());
        assert_eq!(n.requester_id(0).unwrap(), RID);
    }

    /// Sends `n` frames back to back and completes each as it leaves;
    /// returns each completion's interrupt decision.
    fn send_and_complete(nic: &mut Nic, n: usize, now: Time) -> Vec<IrqAction> {
        let link = Link::default();
        for _ in 0..n {
            assert!(nic.tx_enqueue(0, Frame::default()).unwrap());
        }
        let mut at = nic.tx_doorbell(0, now, 0, &link).unwrap();
        let mut out = vec![];
        while let Some(t) = at {
            let (f, a, next) = nic.tx_complete(0, t).unwrap();
            assert!(f.is_some());
            out.push(a);
            at = next;
        }
        out
    }

    /// WTHRESH = 1: every completion raises the cause; the first fires at
    /// once and starts the interval, so an RX frame right after it waits
    /// for the countdown.
    #[test]
    fn wthresh_one_raises_a_tx_cause_per_completion() {
        let mut n = nic(EITR_20K);
        let a = send_and_complete(&mut n, 1, 0);
        assert!(is_fire(a[0]));
        assert_eq!(n.tx_clean(0).unwrap(), 1);
    }

    /// WTHRESH = 8 (3.6's ixgbevf): a lone completion is not written back
    /// and raises nothing, so an RX frame after it interrupts at once and
    /// takes the write-back along; eight completions write back as a burst
    /// with one cause; a held write-back goes out at the ITR timer.
    #[test]
    fn wthresh_eight_writes_back_in_bursts_or_at_the_itr_timer() {
        let mut n = nic_with(NicConfig {
            initial_eitr: EITR_20K,
            tx_wthresh: 8,
            ..NicConfig::default()
        });
        let a = send_and_complete(&mut n, 1, 0);
        let IrqAction::CheckAt { at, gen, .. } = a[0] else {
            panic!("a lone completion arms the ITR timer: {:?}", a[0]);
        };
        // One interval after the completion (the vector never fired).
        assert!(at > INTERVAL_20K && at < 2 * INTERVAL_20K, "{at}");
        assert_eq!(n.tx_clean(0).unwrap(), 0, "not written back yet");
        // An RX frame fires at once (no earlier fire) and carries it.
        let pkt = RxPacket {
            len: 64,
            arrived: at / 2,
            frame: Frame::default(),
        };
        let (_, rx) = n.receive(0, pkt, at / 2).unwrap();
        assert!(is_fire(rx));
        assert_eq!(n.tx_clean(0).unwrap(), 1);
        // The timer event is stale now.
        assert_eq!(n.itr_check(0, 0, gen, at).unwrap(), IrqAction::None);
        // Eight in a row: one write-back, one cause, at the eighth.
        let t0 = 10 * INTERVAL_20K;
        n.enable_vector(0, 0, t0).unwrap();
        let a = send_and_complete(&mut n, 8, t0);
        assert!(a[..7].iter().all(|x| !is_fire(*x)));
        assert!(is_fire(a[7]), "{:?}", a[7]);
        assert_eq!(n.tx_clean(0).unwrap(), 8);
        // Three more: held until the timer, then written back and fired.
        let t1 = 20 * INTERVAL_20K;
        n.enable_vector(0, 0, t1).unwrap();
        let a = send_and_complete(&mut n, 3, t1);
        let IrqAction::CheckAt { at, gen, .. } = a[0] else {
            panic!("{:?}", a[0]);
        };
        assert!(a[1..].iter().all(|x| *x == IrqAction::None));
        assert_eq!(n.tx_clean(0).unwrap(), 0);
        assert!(is_fire(n.itr_check(0, 0, gen, at).unwrap()));
        assert_eq!(n.tx_clean(0).unwrap(), 3);
    }

    #[test]
    fn itr_interval_from_eitr() {
        let mut n = nic(EITR_20K);
        assert_eq!(n.itr_interval(0, 0).unwrap(), INTERVAL_20K);
        // Reserved bits 2:0 are ignored and read back as zero.
        n.write_eitr(0, 0, EITR_20K | 7, 0).unwrap();
        assert_eq!(n.eitr(0, 0).unwrap(), EITR_20K);
        assert_eq!(n.itr_interval(0, 0).unwrap(), INTERVAL_20K);
        // CNT_WDIS is accepted, as ixgbevf writes it.
        n.write_eitr(0, 0, 40 | EITR_CNT_WDIS, 0).unwrap();
        assert_eq!(n.itr_interval(0, 0).unwrap(), 10_240_000);
        n.write_eitr(0, 1, 0, 0).unwrap();
        assert_eq!(n.itr_interval(0, 1).unwrap(), 0);
        assert_eq!(
            n.write_eitr(0, 0, 0x1000, 0),
            Err(NicError::EitrValue(0x1000))
        );
        assert_eq!(n.eitr(0, 0).unwrap(), 40);
    }

    #[test]
    fn first_packet_fires_with_remapped_message() {
        let mut n = nic(EITR_20K);
        let (out, act) = n.receive(0, pkt(0, 0), 0).unwrap();
        assert_eq!(out, RxOutcome::Queued);
        assert_eq!(
            act,
            IrqAction::Fire {
                vf: 0,
                vector: 0,
                msi: RemappableMsi {
                    handle: 100,
                    requester_id: RID
                }
            }
        );
        assert!(!n.cause_pending(0, 0).unwrap());
        assert_eq!(n.counters(0).unwrap().interrupts, 1);
    }

    /// Back-to-back packets with a driver that re-enables immediately: the
    /// fires land exactly one EITR interval apart.
    #[test]
    fn itr_spaces_fires_under_back_to_back_packets() {
        let mut n = nic(EITR_20K);
        let mut fires = Vec::new();
        let mut timer: Option<(Time, u64)> = None;
        let mut seq = 0;
        let mut now = 0;
        while now < 520 * US {
            if let Some((at, gen)) = timer {
                if at <= now {
                    timer = None;
                    let a = n.itr_check(0, 0, gen, at).unwrap();
                    assert!(is_fire(a));
                    fires.push(at);
                    n.write_eims(0, 1, at).unwrap();
                }
            }
            let (_, a) = n.receive(0, pkt(seq, now), now).unwrap();
            seq += 1;
            match a {
                IrqAction::Fire { .. } => {
                    fires.push(now);
                    // NAPI: clean, refill, re-enable.
                    assert!(!n.vector_enabled(0, 0).unwrap());
                    let acts = n.write_eims(0, 1, now).unwrap();
                    assert!(acts.is_empty());
                }
                IrqAction::CheckAt { at, gen, .. } => {
                    assert!(timer.is_none(), "one countdown at a time");
                    timer = Some((at, gen));
                }
                IrqAction::None => {}
            }
            while n.rx_poll(0).unwrap().is_some() {}
            let back = n.rx_awaiting_refill(0).unwrap() as u16;
            n.rx_refill(0, back).unwrap();
            now += 100 * NS;
        }
        assert_eq!(fires[0], 0);
        assert!(fires.len() >= 10);
        for w in fires.windows(2) {
            assert_eq!(w[1] - w[0], INTERVAL_20K);
        }
        let c = n.counters(0).unwrap();
        assert_eq!(c.interrupts, fires.len() as u64);
        assert_eq!(c.itr_deferred, fires.len() as u64 - 1);
    }

    #[test]
    fn zero_eitr_fires_every_packet_once_reenabled() {
        let mut n = nic(0);
        for i in 0..5 {
            let (_, a) = n.receive(0, pkt(i, i * NS), i * NS).unwrap();
            assert!(is_fire(a));
            n.enable_vector(0, 0, i * NS).unwrap();
        }
        assert_eq!(n.counters(0).unwrap().itr_deferred, 0);
    }

    #[test]
    fn auto_mask_holds_until_eims() {
        let mut n = nic(EITR_20K);
        assert!(is_fire(n.receive(0, pkt(0, 0), 0).unwrap().1));
        assert!(!n.vector_enabled(0, 0).unwrap());
        // Long after the interval, still masked: the cause only latches.
        for i in 1..5 {
            let t = i * 100 * US;
            assert_eq!(n.receive(0, pkt(i, t), t).unwrap().1, IrqAction::None);
        }
        assert!(n.cause_pending(0, 0).unwrap());
        assert_eq!(n.counters(0).unwrap().interrupts, 1);
        // The mailbox vector is not affected.
        assert!(n.vector_enabled(0, 1).unwrap());
    }

    #[test]
    fn eims_refires_when_cause_pending() {
        let mut n = nic(EITR_20K);
        n.receive(0, pkt(0, 0), 0).unwrap();
        n.receive(0, pkt(1, 10 * US), 10 * US).unwrap();
        // Re-enable after the interval: fires at once.
        let acts = n.write_eims(0, 0b01, 60 * US).unwrap();
        assert_eq!(acts.len(), 1);
        assert!(is_fire(acts.as_slice()[0]));
        assert!(!n.cause_pending(0, 0).unwrap());
        assert!(!n.vector_enabled(0, 0).unwrap());
        // Re-enable inside the interval with a cause pending: countdown.
        n.receive(0, pkt(2, 70 * US), 70 * US).unwrap();
        let acts = n.write_eims(0, 0b11, 80 * US).unwrap();
        assert_eq!(acts.len(), 1);
        match acts.as_slice()[0] {
            IrqAction::CheckAt {
                vf: 0,
                vector: 0,
                at,
                gen,
            } => {
                assert_eq!(at, 60 * US + INTERVAL_20K);
                assert!(is_fire(n.itr_check(0, 0, gen, at).unwrap()));
            }
            other => panic!("expected CheckAt, got {other:?}"),
        }
        assert_eq!(n.counters(0).unwrap().itr_deferred, 1);
    }

    #[test]
    fn eimc_masks_and_countdown_then_does_nothing() {
        let mut n = nic(EITR_20K);
        n.receive(0, pkt(0, 0), 0).unwrap();
        n.write_eims(0, 1, US).unwrap();
        let IrqAction::CheckAt { at, gen, .. } = n.receive(0, pkt(1, 2 * US), 2 * US).unwrap().1
        else {
            panic!("expected CheckAt");
        };
        n.write_eimc(0, 1).unwrap();
        assert!(!n.vector_enabled(0, 0).unwrap());
        assert_eq!(n.itr_check(0, 0, gen, at).unwrap(), IrqAction::None);
        assert!(n.cause_pending(0, 0).unwrap());
        // Unmasking later fires at once; it was held by ITR first.
        assert!(is_fire(n.enable_vector(0, 0, at + US).unwrap()));
        assert_eq!(n.counters(0).unwrap().itr_deferred, 1);
    }

    #[test]
    fn msix_mask_holds_and_unmask_delivers() {
        let mut n = nic(0);
        n.set_msix_masked(0, 0, true, 0).unwrap();
        assert!(n.msix_masked(0, 0).unwrap());
        assert_eq!(n.receive(0, pkt(0, 0), 0).unwrap().1, IrqAction::None);
        assert!(is_fire(n.set_msix_masked(0, 0, false, US).unwrap()));
    }

    /// CNT_WDIS: rewriting EITR mid-countdown measures the new interval from
    /// the last fire, not from the write.
    #[test]
    fn eitr_rewrite_keeps_countdown_from_last_fire() {
        let mut n = nic(EITR_20K);
        n.receive(0, pkt(0, 0), 0).unwrap();
        n.write_eims(0, 1, US).unwrap();
        let IrqAction::CheckAt {
            at: at1, gen: g1, ..
        } = n.receive(0, pkt(1, 10 * US), 10 * US).unwrap().1
        else {
            panic!("expected CheckAt");
        };
        assert_eq!(at1, INTERVAL_20K);
        // Double the interval at 20 µs: due at 102.4 µs, not 122.4 µs.
        let IrqAction::CheckAt {
            at: at2, gen: g2, ..
        } = n.write_eitr(0, 0, 2 * EITR_20K, 20 * US).unwrap()
        else {
            panic!("expected a new CheckAt");
        };
        assert_eq!(at2, 2 * INTERVAL_20K);
        assert_ne!(g1, g2);
        assert_eq!(n.itr_check(0, 0, g1, at1).unwrap(), IrqAction::None);
        assert!(is_fire(n.itr_check(0, 0, g2, at2).unwrap()));

        // Shrinking below the time already elapsed fires at the write.
        n.write_eitr(0, 0, EITR_20K, at2).unwrap();
        n.write_eims(0, 1, at2).unwrap();
        let t = at2 + 20 * US;
        assert!(matches!(
            n.receive(0, pkt(2, t), t).unwrap().1,
            IrqAction::CheckAt { .. }
        ));
        // 10.24 µs interval, 20 µs since the last fire.
        assert!(is_fire(n.write_eitr(0, 0, 40, t).unwrap()));
        // With no countdown armed, an EITR write does nothing else.
        assert_eq!(n.write_eitr(0, 0, 80, t).unwrap(), IrqAction::None);
    }

    #[test]
    fn stale_gen_is_ignored() {
        let mut n = nic(EITR_20K);
        n.receive(0, pkt(0, 0), 0).unwrap();
        n.write_eims(0, 1, US).unwrap();
        let IrqAction::CheckAt { at, gen, .. } = n.receive(0, pkt(1, 2 * US), 2 * US).unwrap().1
        else {
            panic!("expected CheckAt");
        };
        // A wrong token does nothing and leaves the countdown armed.
        assert_eq!(n.itr_check(0, 0, gen + 1, at).unwrap(), IrqAction::None);
        assert_eq!(n.itr_armed(0, 0).unwrap(), Some(at));
        // Repeated packets while armed do not hand out more events.
        assert_eq!(
            n.receive(0, pkt(2, 3 * US), 3 * US).unwrap().1,
            IrqAction::None
        );
        assert!(is_fire(n.itr_check(0, 0, gen, at).unwrap()));
        // The same token again, after it fired: stale.
        n.write_eims(0, 1, at).unwrap();
        n.receive(0, pkt(3, at + US), at + US).unwrap();
        assert_eq!(n.itr_check(0, 0, gen, at + US).unwrap(), IrqAction::None);
        assert_eq!(n.counters(0).unwrap().interrupts, 2);
    }

    #[test]
    fn ring_full_drops_then_refill_recovers() {
        let mut n = nic_with(NicConfig {
            rx_ring_size: 4,
            ..NicConfig::default()
        });
        for i in 0..3 {
            assert_eq!(n.receive(0, pkt(i, 0), 0).unwrap().0, RxOutcome::Queued);
        }
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 0);
        assert_eq!(n.rx_ring_pointers(0).unwrap(), (3, 3));
        let (out, act) = n.receive(0, pkt(3, 0), 0).unwrap();
        assert_eq!((out, act), (RxOutcome::Dropped, IrqAction::None));
        assert_eq!(n.rx_poll(0).unwrap().map(seq_of), Some(0));
        assert_eq!(n.rx_poll(0).unwrap().map(seq_of), Some(1));
        // Cleaned but not returned: still no room.
        assert_eq!(n.receive(0, pkt(4, 0), 0).unwrap().0, RxOutcome::Dropped);
        n.rx_refill(0, 2).unwrap();
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 2);
        assert_eq!(n.rx_ring_pointers(0).unwrap(), (3, 1));
        assert_eq!(n.receive(0, pkt(5, 0), 0).unwrap().0, RxOutcome::Queued);
        assert_eq!(n.rx_poll(0).unwrap().map(seq_of), Some(2));
        assert_eq!(n.rx_poll(0).unwrap().map(seq_of), Some(5));
        assert_eq!(n.rx_poll(0).unwrap(), None);
        let c = n.counters(0).unwrap();
        assert_eq!(c.rx_missed, 2);
        assert_eq!(c.rx_packets, 4);
        assert_eq!(c.rx_cleaned, 4);
        assert_eq!(c.rx_bytes, 4 * 1514);
    }

    #[test]
    fn refill_more_than_cleaned_is_error() {
        let mut n = nic(0);
        assert_eq!(
            n.rx_refill(0, 1),
            Err(NicError::RefillExceedsCleaned {
                vf: 0,
                requested: 1,
                cleaned: 0
            })
        );
        n.receive(0, pkt(0, 0), 0).unwrap();
        n.receive(0, pkt(1, 0), 0).unwrap();
        n.rx_poll(0).unwrap();
        assert!(n.rx_refill(0, 2).is_err());
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 509);
        n.rx_refill(0, 1).unwrap();
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 510);
        assert!(n.rx_refill(0, 1).is_err());
    }

    #[test]
    fn unprogrammed_vector_never_fires() {
        let mut n = Nic::new(NicConfig::default(), &[RID]).unwrap();
        for i in 0..4 {
            let t = i * 100 * US;
            assert_eq!(n.receive(0, pkt(i, t), t).unwrap().1, IrqAction::None);
        }
        assert!(n.write_eics(0, 0b11, 500 * US).unwrap().is_empty());
        assert!(n.write_eims(0, 0b11, 600 * US).unwrap().is_empty());
        let c = n.counters(0).unwrap();
        assert_eq!(c.interrupts, 0);
        assert_eq!(c.unprogrammed, 8);
        // Program behind a mask, then unmask: the latched cause goes out.
        n.set_msix_masked(0, 0, true, 0).unwrap();
        n.program_msix(0, 0, 42).unwrap();
        let a = n.set_msix_masked(0, 0, false, 700 * US).unwrap();
        assert!(matches!(
            a,
            IrqAction::Fire {
                msi: RemappableMsi { handle: 42, .. },
                ..
            }
        ));
    }

    #[test]
    fn eics_kicks_mailbox_vector() {
        let mut n = nic(EITR_20K);
        let acts = n.write_eics(0, 1 << MAILBOX_VECTOR, 0).unwrap();
        assert_eq!(acts.len(), 1);
        let a: Vec<IrqAction> = acts.into_iter().collect();
        assert!(matches!(
            a[0],
            IrqAction::Fire {
                vector: MAILBOX_VECTOR,
                msi: RemappableMsi { handle: 101, .. },
                ..
            }
        ));
        // Both vectors in one write: two actions, ascending.
        n.write_eims(0, 0b10, US).unwrap();
        let acts = n.write_eics(0, 0b11, 100 * US).unwrap();
        let vectors: Vec<u8> = acts
            .iter()
            .map(|a| match a {
                IrqAction::Fire { vector, .. } => *vector,
                _ => 99,
            })
            .collect();
        assert_eq!(vectors, vec![0, 1]);
    }

    #[test]
    fn eiam_off_keeps_vector_enabled_but_throttled() {
        let mut n = nic(EITR_20K);
        n.write_eiam(0, 0b10).unwrap();
        assert!(is_fire(n.receive(0, pkt(0, 0), 0).unwrap().1));
        assert!(n.vector_enabled(0, 0).unwrap());
        let a = n.receive(0, pkt(1, US), US).unwrap().1;
        assert!(matches!(a, IrqAction::CheckAt { at, .. } if at == INTERVAL_20K));
    }

    #[test]
    fn multiple_vfs_are_independent() {
        let mut n = nic_with(NicConfig {
            vfs: 3,
            ..NicConfig::default()
        });
        let a = n.receive(2, pkt(0, 0), 0).unwrap().1;
        assert!(matches!(
            a,
            IrqAction::Fire {
                vf: 2,
                msi: RemappableMsi {
                    requester_id: 0x0312,
                    ..
                },
                ..
            }
        ));
        assert_eq!(n.rx_pending(0).unwrap(), 0);
        assert_eq!(n.rx_pending(2).unwrap(), 1);
        assert!(n.vector_enabled(0, 0).unwrap());
    }

    #[test]
    fn bad_indexes_are_errors() {
        let mut n = nic(0);
        let bad_vf = NicError::BadVf { vf: 1, vfs: 1 };
        let bad_vec = NicError::BadVector {
            vf: 0,
            vector: 2,
            vectors: 2,
        };
        assert_eq!(n.requester_id(1), Err(bad_vf.clone()));
        assert_eq!(n.program_msix(1, 0, 1), Err(bad_vf.clone()));
        assert_eq!(n.program_msix(0, 2, 1), Err(bad_vec.clone()));
        assert_eq!(n.set_msix_masked(0, 2, true, 0), Err(bad_vec.clone()));
        assert_eq!(n.receive(1, pkt(0, 0), 0), Err(bad_vf.clone()));
        assert_eq!(n.itr_check(1, 0, 0, 0), Err(bad_vf.clone()));
        assert_eq!(
            n.itr_check(0, 200, 0, 0).unwrap_err(),
            NicError::BadVector {
                vf: 0,
                vector: 200,
                vectors: 2
            }
        );
        assert_eq!(n.write_eitr(1, 0, 0, 0), Err(bad_vf.clone()));
        assert_eq!(n.eitr(0, 2), Err(bad_vec.clone()));
        assert_eq!(
            n.itr_interval(u16::MAX, 0).unwrap_err(),
            NicError::BadVf {
                vf: u16::MAX,
                vfs: 1
            }
        );
        assert_eq!(n.enable_vector(0, 2, 0), Err(bad_vec.clone()));
        assert_eq!(n.trigger_vector(0, 2, 0), Err(bad_vec.clone()));
        assert_eq!(n.write_eims(1, 1, 0), Err(bad_vf.clone()));
        let bad_bits = NicError::BadVectorBits {
            vf: 0,
            bits: 0b100,
            vectors: 2,
        };
        assert_eq!(n.write_eims(0, 0b100, 0), Err(bad_bits.clone()));
        assert_eq!(n.write_eimc(0, 0b100), Err(bad_bits.clone()));
        assert_eq!(n.write_eics(0, 0b100, 0), Err(bad_bits.clone()));
        assert_eq!(n.write_eiam(0, 0b100), Err(bad_bits));
        assert_eq!(n.write_eimc(1, 1), Err(bad_vf.clone()));
        assert_eq!(n.write_eics(1, 1, 0), Err(bad_vf.clone()));
        assert_eq!(n.vector_enabled(0, 2), Err(bad_vec.clone()));
        assert_eq!(n.cause_pending(0, 2), Err(bad_vec.clone()));
        assert_eq!(n.msix_masked(0, 2), Err(bad_vec.clone()));
        assert_eq!(n.itr_armed(0, 2), Err(bad_vec));
        assert_eq!(n.rx_pending(1), Err(bad_vf.clone()));
        assert_eq!(n.rx_poll(1), Err(bad_vf.clone()));
        assert_eq!(n.rx_refill(1, 0), Err(bad_vf.clone()));
        assert_eq!(n.rx_free_descriptors(1), Err(bad_vf.clone()));
        assert_eq!(n.rx_awaiting_refill(1), Err(bad_vf.clone()));
        assert_eq!(n.rx_ring_pointers(1), Err(bad_vf.clone()));
        assert_eq!(n.counters(1), Err(bad_vf));
        // Nothing changed along the way.
        assert_eq!(n.counters(0).unwrap(), VfCounters::default());
        assert!(n.vector_enabled(0, 0).unwrap());
    }

    #[test]
    fn bad_configs_are_errors() {
        let cfg = NicConfig::default();
        assert_eq!(
            Nic::new(NicConfig { vfs: 0, ..cfg }, &[]).unwrap_err(),
            NicError::NoVfs
        );
        assert_eq!(
            Nic::new(cfg, &[1, 2]).unwrap_err(),
            NicError::RequesterIds { vfs: 1, got: 2 }
        );
        assert_eq!(
            Nic::new(
                NicConfig {
                    rx_ring_size: 1,
                    ..cfg
                },
                &[1]
            )
            .unwrap_err(),
            NicError::RingTooSmall(1)
        );
        for bad in [0, 4, 255] {
            assert_eq!(
                Nic::new(
                    NicConfig {
                        vectors_per_vf: bad,
                        ..cfg
                    },
                    &[1]
                )
                .unwrap_err(),
                NicError::VectorCount(bad)
            );
        }
        assert_eq!(
            Nic::new(
                NicConfig {
                    initial_eitr: 1 << 15,
                    ..cfg
                },
                &[1]
            )
            .unwrap_err(),
            NicError::EitrValue(1 << 15)
        );
        let n = Nic::new(
            NicConfig {
                vectors_per_vf: 3,
                rx_ring_size: 2,
                ..cfg
            },
            &[1],
        )
        .unwrap();
        assert_eq!(n.rx_free_descriptors(0).unwrap(), 1);
        assert_eq!(n.config().vectors_per_vf, 3);
    }

    #[test]
    fn wire_time_at_10g() {
        let link = Link::default();
        assert_eq!(link.bits_per_sec, 10_000_000_000);
        assert_eq!(link.propagation_ps, 500 * NS);
        // 64 + FCS 4 + 20 = 88 bytes = 704 bits = 70.4 ns.
        assert_eq!(link.wire_time(64), 70_400);
        // 128 + 4 + 20 = 152 bytes = 121.6 ns.
        assert_eq!(link.wire_time(128), 121_600);
        // 1518 + 4 + 20 = 1542 bytes = 1233.6 ns.
        assert_eq!(link.wire_time(1518), 1_233_600);
        // Minimum frame: 60 bytes + FCS = 64, so 84 bytes = 67.2 ns; runts
        // are padded to the same.
        assert_eq!(link.wire_time(60), 67_200);
        assert_eq!(link.wire_time(0), 67_200);
        // Full-size 1514-byte frame: 1538 bytes = 1230.4 ns.
        assert_eq!(link.wire_time(1514), 1_230_400);
        assert_eq!(link.delivery_time(60), 67_200 + 500 * NS);
        // A GSO packet takes the wire time of its train of frames.
        let seg = crate::hw::wire::TcpSegment {
            len: 2 * 1448 + 10,
            ..Default::default()
        };
        let p = Frame::tcp_gso(1, seg, 1448, 0);
        assert_eq!(
            link.frame_wire_time(&p),
            2 * link.wire_time(1514) + link.wire_time(76)
        );
        let one = Frame::tcp(1, crate::hw::wire::TcpSegment::default(), 0);
        assert_eq!(link.frame_wire_time(&one), link.wire_time(66));
    }

    #[test]
    fn wire_time_edge_rates() {
        let dead = Link {
            bits_per_sec: 0,
            propagation_ps: 1,
        };
        assert_eq!(dead.wire_time(64), Time::MAX);
        assert_eq!(dead.delivery_time(64), Time::MAX);
        // 1 Gb/s, 84 bytes = 672 ns; 3 b/s rounds up.
        let gig = Link {
            bits_per_sec: 1_000_000_000,
            propagation_ps: 0,
        };
        assert_eq!(gig.wire_time(60), 672 * NS);
        let slow = Link {
            bits_per_sec: 3,
            propagation_ps: 0,
        };
        assert_eq!(slow.wire_time(60), (672 * SEC).div_ceil(3));
        let huge = Link {
            bits_per_sec: 1,
            propagation_ps: 0,
        };
        assert_eq!(huge.wire_time(u32::MAX), Time::MAX);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Arrive { gap: Time, len: u32 },
        Poll(u8),
        Refill(u16),
        Eims(u32),
        Eimc(u32),
        Eics(u32),
        Eitr { vector: u8, value: u32 },
        MsixMask { vector: u8, masked: bool },
        Idle(Time),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..30 * US, 0u32..2000).prop_map(|(gap, len)| Op::Arrive { gap, len }),
            3 => (1u8..6).prop_map(Op::Poll),
            2 => (0u16..6).prop_map(Op::Refill),
            2 => (1u32..4).prop_map(Op::Eims),
            1 => (1u32..4).prop_map(Op::Eimc),
            1 => (1u32..4).prop_map(Op::Eics),
            1 => (0u8..2, 0u32..0x400).prop_map(|(vector, value)| Op::Eitr { vector, value }),
            1 => (0u8..2, any::<bool>()).prop_map(|(vector, masked)| Op::MsixMask { vector, masked }),
            1 => (0..200 * US).prop_map(Op::Idle),
        ]
    }

    /// Drives the NIC the way the platform would: `CheckAt` events are
    /// delivered in time order as simulated time passes.
    struct Harness {
        nic: Nic,
        now: Time,
        timers: Vec<(Time, u8, u64)>,
        last_fire: [Option<Time>; 2],
        fires: u64,
    }

    impl Harness {
        fn handle(&mut self, a: IrqAction) -> Result<(), TestCaseError> {
            match a {
                IrqAction::None => {}
                IrqAction::Fire { vf, vector, msi } => {
                    prop_assert_eq!(vf, 0);
                    prop_assert_eq!(msi.requester_id, RID);
                    let interval = self.nic.itr_interval(0, vector).unwrap();
                    if let Some(prev) = self.last_fire[usize::from(vector)] {
                        prop_assert!(
                            self.now - prev >= interval,
                            "vector {} fired {} ps after its last fire, interval {}",
                            vector,
                            self.now - prev,
                            interval
                        );
                    }
                    self.last_fire[usize::from(vector)] = Some(self.now);
                    self.fires += 1;
                }
                IrqAction::CheckAt {
                    vf,
                    vector,
                    at,
                    gen,
                } => {
                    prop_assert_eq!(vf, 0);
                    prop_assert!(at > self.now);
                    self.timers.push((at, vector, gen));
                }
            }
            Ok(())
        }

        fn advance(&mut self, to: Time) -> Result<(), TestCaseError> {
            loop {
                let next = self
                    .timers
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.0 <= to)
                    .min_by_key(|(_, t)| t.0)
                    .map(|(i, _)| i);
                let Some(i) = next else { break };
                let (at, vector, gen) = self.timers.swap_remove(i);
                self.now = at;
                let a = self.nic.itr_check(0, vector, gen, at).unwrap();
                self.handle(a)?;
            }
            self.now = to;
            Ok(())
        }
    }

    proptest! {
        #[test]
        fn fires_spaced_and_packets_conserved(ops in prop::collection::vec(op(), 1..300)) {
            let mut h = Harness {
                nic: nic_with(NicConfig { rx_ring_size: 8, initial_eitr: EITR_20K, ..NicConfig::default() }),
                now: 0,
                timers: Vec::new(),
                last_fire: [None; 2],
                fires: 0,
            };
            let (mut offered, mut cleaned, mut seq) = (0u64, 0u64, 0u64);
            for op in ops {
                match op {
                    Op::Arrive { gap, len } => {
                        h.advance(h.now + gap)?;
                        offered += 1;
                        let p = RxPacket { len, arrived: h.now, frame: Frame { flow: 1, transport: crate::hw::wire::Transport::Udp { len, seq }, sent: h.now, gso_size: 0 } };
                        seq += 1;
                        let (_, a) = h.nic.receive(0, p, h.now).unwrap();
                        h.handle(a)?;
                    }
                    Op::Poll(k) => {
                        for _ in 0..k {
                            if h.nic.rx_poll(0).unwrap().is_some() {
                                cleaned += 1;
                            }
                        }
                    }
                    Op::Refill(n) => {
                        let ok = usize::from(n) <= h.nic.rx_awaiting_refill(0).unwrap();
                        prop_assert_eq!(h.nic.rx_refill(0, n).is_ok(), ok);
                    }
                    Op::Eims(bits) => {
                        for a in h.nic.write_eims(0, bits, h.now).unwrap() {
                            h.handle(a)?;
                        }
                    }
                    Op::Eimc(bits) => h.nic.write_eimc(0, bits).unwrap(),
                    Op::Eics(bits) => {
                        for a in h.nic.write_eics(0, bits, h.now).unwrap() {
                            h.handle(a)?;
                        }
                    }
                    Op::Eitr { vector, value } => {
                        let a = h.nic.write_eitr(0, vector, value, h.now).unwrap();
                        h.handle(a)?;
                    }
                    Op::MsixMask { vector, masked } => {
                        let a = h.nic.set_msix_masked(0, vector, masked, h.now).unwrap();
                        h.handle(a)?;
                    }
                    Op::Idle(gap) => h.advance(h.now + gap)?,
                }
                let c = h.nic.counters(0).unwrap();
                let pending = h.nic.rx_pending(0).unwrap() as u64;
                prop_assert_eq!(c.rx_packets, cleaned + pending);
                prop_assert_eq!(c.rx_packets + c.rx_missed, offered);
                prop_assert_eq!(c.rx_cleaned, cleaned);
                let owned = h.nic.rx_free_descriptors(0).unwrap()
                    + h.nic.rx_pending(0).unwrap()
                    + h.nic.rx_awaiting_refill(0).unwrap();
                prop_assert_eq!(owned, 7);
            }
            h.advance(h.now + SEC)?;
            let c = h.nic.counters(0).unwrap();
            prop_assert_eq!(c.interrupts, h.fires);
            prop_assert!(c.itr_deferred <= c.interrupts);
        }
    }

    /// The Toeplitz hash of the RSS specification's IPv4/TCP example:
    /// 66.9.149.187:2794 -> 161.142.100.80:1766 under its sample key
    /// hashes to 0x51ccc178 (and the addresses alone to 0x323e8fc2).
    #[test]
    fn toeplitz_matches_the_rss_specification_example() {
        let key: [u8; 40] = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        let t = crate::hw::wire::Tuple {
            src_ip: [66, 9, 149, 187],
            dst_ip: [161, 142, 100, 80],
            src_port: 2794,
            dst_port: 1766,
        };
        let input = rss_input(&t);
        assert_eq!(toeplitz(&key, &input), 0x51cc_c178);
        assert_eq!(toeplitz(&key, &input[..8]), 0x323e_8fc2);
    }

    fn tcp(flow: u16, seq: u64, now: Time) -> RxPacket {
        let seg = crate::hw::wire::TcpSegment {
            seq,
            len: 1448,
            ..Default::default()
        };
        let frame = Frame::tcp(flow, seg, now);
        RxPacket {
            len: frame.len(),
            arrived: now,
            frame,
        }
    }

    /// Eight queue pairs, the ixgbe key and a round-robin table.
    fn rss_nic(queues: u8) -> Nic {
        let mut n = nic_with(NicConfig {
            queues,
            vectors_per_vf: queues + 1,
            ..NicConfig::default()
        });
        let key = crate::guest::net::IXGBE_RSS_KEY;
        n.configure_rss(0, &key, &crate::guest::net::ixgbe_reta(queues))
            .unwrap();
        n
    }

    /// A flow lands in the queue the RETA entry at its hash's seven low
    /// bits names; its frames stay there, in order; the write-back raises
    /// that queue's vector only.
    #[test]
    fn rss_puts_each_flow_in_the_queue_reta_names_in_order() {
        let mut n = rss_nic(8);
        let reta = crate::guest::net::ixgbe_reta(8);
        let mut used = [0u32; 8];
        for flow in 1..=64u16 {
            let f = tcp(flow, 0, 0).frame;
            let hash = n.rss_hash(0, &f).unwrap().expect("RSS is on");
            let q = n.rx_queue_of(0, &f).unwrap();
            assert_eq!(q, reta[(hash & 127) as usize], "flow {flow}");
            assert_eq!(q, (hash % 8) as u8, "round-robin table of 8: hash mod 8");
            used[usize::from(q)] += 1;
        }
        assert!(
            used.iter().all(|&u| u > 0),
            "64 flows reach every queue: {used:?}"
        );
        let flow = 5;
        let q = n.rx_queue_of(0, &tcp(flow, 0, 0).frame).unwrap();
        for k in 0..20u64 {
            let (out, a) = n.receive(0, tcp(flow, k * 1448, k * US), k * US).unwrap();
            assert_eq!(out, RxOutcome::Queued);
            if let IrqAction::Fire { vector, .. } = a {
                assert_eq!(vector, q, "the queue's own vector fires");
            }
        }
        for other in (0..8).filter(|&o| o != q) {
            assert_eq!(n.rx_pending_on(0, other).unwrap(), 0, "queue {other}");
        }
        assert_eq!(n.rx_queue_packets(0, q).unwrap(), 20);
        let seqs: Vec<u64> = std::iter::from_fn(|| n.rx_poll_on(0, q).unwrap())
            .map(seq_of)
            .collect();
        assert_eq!(seqs, (0..20).map(|k| k * 1448).collect::<Vec<_>>());
    }

    /// Without RSS (one queue, or before the driver enables it) every
    /// frame goes to queue 0.
    #[test]
    fn without_rss_every_frame_takes_queue_zero() {
        let mut n = nic_with(NicConfig {
            queues: 4,
            vectors_per_vf: 5,
            ..NicConfig::default()
        });
        for flow in 1..=16u16 {
            assert_eq!(n.rx_queue_of(0, &tcp(flow, 0, 0).frame).unwrap(), 0);
            n.receive(0, tcp(flow, 0, 0), 0).unwrap();
        }
        assert_eq!(n.rx_pending_on(0, 0).unwrap(), 16);
        let one = nic(0);
        assert_eq!(one.rss_hash(0, &tcp(3, 0, 0).frame).unwrap(), None);
    }

    /// A TX queue's completions raise its own vector, and only its ring
    /// is cleaned.
    #[test]
    fn each_tx_queue_completes_on_its_own_vector() {
        let mut n = rss_nic(4);
        let link = Link::default();
        for q in 0..4u8 {
            assert!(n.tx_enqueue_on(0, q, tcp(1, 0, 0).frame).unwrap());
            let head = n
                .tx_doorbell_on(0, q, 0, 0, &link)
                .unwrap()
                .expect("idle queue");
            let (f, a, next) = n.tx_complete_on(0, q, head).unwrap();
            assert!(f.is_some() && next.is_none());
            match a {
                IrqAction::Fire { vector, .. } => assert_eq!(vector, q),
                other => panic!("queue {q}: {other:?}"),
            }
            assert_eq!(n.tx_clean_on(0, q).unwrap(), 1);
        }
        assert_eq!(n.counters(0).unwrap().tx_packets, 4);
    }

    /// Bad queue counts, vectors, queue indexes and table entries are
    /// errors naming what is wrong.
    #[test]
    fn queue_configuration_is_checked() {
        let cfg = NicConfig::default();
        for bad in [0, MAX_QUEUES + 1] {
            let e = Nic::new(NicConfig { queues: bad, ..cfg }, &[1]).unwrap_err();
            assert_eq!(e, NicError::QueueCount(bad));
        }
        // Fewer vectors than queues, or a VF's three exceeded with one queue.
        let e = Nic::new(
            NicConfig {
                queues: 8,
                vectors_per_vf: 4,
                ..cfg
            },
            &[1],
        )
        .unwrap_err();
        assert_eq!(e, NicError::VectorCount(4));
        let mut n = rss_nic(2);
        assert_eq!(
            n.rx_poll_on(0, 2).unwrap_err(),
            NicError::BadQueue {
                vf: 0,
                queue: 2,
                queues: 2
            }
        );
        let mut reta = crate::guest::net::ixgbe_reta(2);
        reta[77] = 2;
        let key = crate::guest::net::IXGBE_RSS_KEY;
        assert_eq!(
            n.configure_rss(0, &key, &reta).unwrap_err(),
            NicError::RetaEntry {
                index: 77,
                queue: 2,
                queues: 2
            }
        );
    }
}
