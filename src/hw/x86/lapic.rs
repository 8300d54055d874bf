//! The x2APIC local APIC of one core (Intel SDM Vol. 3, ch. 10 "Advanced
//! Programmable Interrupt Controller").
//!
//! The model keeps the architectural state that decides when a VM exits or an
//! interrupt is delivered: the IRR/ISR/TMR vector bitmaps, TPR and the derived
//! PPR, the NMI latch, the ICR and SELF IPI registers, and the APIC timer in
//! its three modes. Software reaches it the way an x2APIC guest does, through
//! RDMSR/WRMSR on the 0x800..=0x8FF MSR range, and a write reports what the
//! platform must do next (an EOI, an IPI to route, a timer event to schedule).
//! Time is only read, never advanced: the platform schedules a timer expiry at
//! the deadline a write returns and calls [`Lapic::timer_expired`] when it
//! comes due.

use crate::engine::Time;

/// 256-bit vector bitmap (IRR, ISR, TMR, EOI-exit bitmap...).
///
/// Bit `v` of the bitmap is bit `v % 64` of word `v / 64`, so word 0 holds
/// vectors 0..=63 as the APIC's 32-bit register chunks would, two at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApicBitmap(pub [u64; 4]);

impl ApicBitmap {
    /// A bitmap with no vector set.
    pub const EMPTY: ApicBitmap = ApicBitmap([0; 4]);

    /// Sets the bit of vector `v`.
    pub fn set(&mut self, v: u8) {
        self.0[usize::from(v >> 6)] |= 1u64 << (v & 63);
    }

    /// Clears the bit of vector `v`.
    pub fn clear(&mut self, v: u8) {
        self.0[usize::from(v >> 6)] &= !(1u64 << (v & 63));
    }

    /// Whether the bit of vector `v` is set.
    pub fn test(&self, v: u8) -> bool {
        self.0[usize::from(v >> 6)] & (1u64 << (v & 63)) != 0
    }

    /// The highest vector set: the one the APIC's priority logic looks at.
    #[inline]
    pub fn highest(&self) -> Option<u8> {
        // Unrolled: it runs on every look at a LAPIC (each guest step).
        let [a, b, c, d] = self.0;
        let (i, w) = if d != 0 {
            (3, d)
        } else if c != 0 {
            (2, c)
        } else if b != 0 {
            (1, b)
        } else if a != 0 {
            (0, a)
        } else {
            return None;
        };
        Some((i * 64 + 63 - w.leading_zeros()) as u8)
    }

    /// Whether no vector is set.
    pub fn is_empty(&self) -> bool {
        let [a, b, c, d] = self.0;
        (a | b | c | d) == 0
    }

    /// How many vectors are set.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// The vectors set, lowest first. Scans a word at a time: the cost is
    /// the number of vectors set, not 256 tests.
    pub fn iter(&self) -> ApicBits {
        ApicBits {
            words: self.0,
            word: 0,
        }
    }

    /// Sets every vector set in `other` (a word-wise OR).
    #[inline]
    pub fn union_with(&mut self, other: &ApicBitmap) {
        for (w, o) in self.0.iter_mut().zip(other.0) {
            *w |= o;
        }
    }

    /// The 32-bit register chunk `n` (0..=7) as ISRn/TMRn/IRRn read it:
    /// vectors `32n..32n+31`, lowest vector in bit 0. Chunks past 7 read 0.
    pub fn chunk32(&self, n: usize) -> u32 {
        match self.0.get(n / 2) {
            Some(w) => (w >> ((n % 2) * 32)) as u32,
            None => 0,
        }
    }
}

/// The vectors set in an [`ApicBitmap`], lowest first ([`ApicBitmap::iter`]):
/// a copy of the words, each emptied bit by bit with `trailing_zeros`.
#[derive(Clone, Debug)]
pub struct ApicBits {
    words: [u64; 4],
    word: usize,
}

impl Iterator for ApicBits {
    type Item = u8;

    #[inline]
    fn next(&mut self) -> Option<u8> {
        while self.word < 4 {
            let w = &mut self.words[self.word];
            if *w != 0 {
                let bit = w.trailing_zeros();
                *w &= *w - 1;
                return Some((self.word as u32 * 64 + bit) as u8);
            }
            self.word += 1;
        }
        None
    }
}

/// Interrupt delivery mode (ICR, MSI data, IRTE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Deliver the vector to every destination named (delivery mode 000).
    Fixed,
    /// Deliver the vector to the lowest-priority core among the destinations
    /// (delivery mode 001); the platform does the arbitration.
    LowestPriority,
    /// Non-maskable interrupt (delivery mode 100); the vector is ignored.
    Nmi,
}

/// Destination of an IPI written to the ICR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpiDest {
    /// No shorthand: the core whose x2APIC id is given (physical mode).
    Physical(u32),
    /// Shorthand 01: the sending core itself.
    SelfOnly,
    /// Shorthand 10, or no shorthand with the broadcast destination
    /// [`X2APIC_BROADCAST_ID`] (the message the shorthand itself puts on the
    /// bus, SDM 10.6.1): every core, the sender included.
    AllIncludingSelf,
    /// Shorthand 11: every core but the sender.
    AllExcludingSelf,
}

/// The x2APIC physical destination that addresses every local APIC (SDM
/// 10.6.2.1, 10.12.9: all ones in the 32-bit destination field).
pub const X2APIC_BROADCAST_ID: u32 = 0xFFFF_FFFF;

/// An inter-processor interrupt a core asked its APIC to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipi {
    /// Who receives it.
    pub dest: IpiDest,
    /// The vector; 2 for NMIs, whose ICR vector field is ignored.
    pub vector: u8,
    /// How the receivers take it.
    pub mode: DeliveryMode,
}

/// The APIC timer mode selected by LVT Timer bits 18:17.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerMode {
    /// 00: count down once from the initial count.
    OneShot,
    /// 01: count down and reload from the initial count, forever.
    Periodic,
    /// 10: fire when the TSC reaches IA32_TSC_DEADLINE.
    TscDeadline,
}

/// What a write of LVT Timer that changes the timer mode does to a running
/// countdown. The hardware and KVM's emulation differ, and the emulated
/// LAPIC of the hypervisor follows KVM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimerModeChange {
    /// The processor (SDM 10.5.4.1): "A write to the LVT Timer Register that
    /// changes the timer mode disarms the local APIC timer." Nothing is
    /// said of the initial count, so TMICT keeps its value.
    #[default]
    Disarm,
    /// KVM's emulated LAPIC (`apic_update_lvtt` in arch/x86/kvm/lapic.c):
    /// a switch between one-shot and periodic leaves the countdown running
    /// (the new mode decides what happens when it reaches zero); only a
    /// switch into or out of TSC-deadline mode cancels the timer, and it
    /// then zeroes TMICT and the deadline as well.
    KeepUnlessTscDeadline,
}

/// Constants of the x2APIC MSR map (SDM Vol.3 table 10-6).
pub mod msr {
    /// The MSR range the x2APIC architecture reserves for APIC registers.
    pub const X2APIC_RANGE: core::ops::RangeInclusive<u32> = 0x800..=0x8FF;
    /// The first and last x2APIC MSR that name an xAPIC register (offset
    /// `(msr - 0x800) << 4` of the APIC page; 0x800..=0x83F).
    pub const X2APIC_FIRST: u32 = 0x800;
    /// See [`X2APIC_FIRST`].
    pub const X2APIC_LAST: u32 = 0x83F;
    /// Local APIC ID (read-only in x2APIC mode).
    pub const APICID: u32 = 0x802;
    /// Local APIC version (read-only).
    pub const VERSION: u32 = 0x803;
    /// Task-priority register.
    pub const TPR: u32 = 0x808;
    /// Processor-priority register (read-only).
    pub const PPR: u32 = 0x80A;
    /// End-of-interrupt (write-only, value must be 0).
    pub const EOI: u32 = 0x80B;
    /// Logical destination register (read-only in x2APIC mode).
    pub const LDR: u32 = 0x80D;
    /// Spurious-interrupt vector register.
    pub const SVR: u32 = 0x80F;
    /// In-service register, bits 31:0; ISR1..ISR7 follow at 0x811..=0x817.
    pub const ISR0: u32 = 0x810;
    /// Trigger-mode register, bits 31:0; TMR1..TMR7 follow at 0x819..=0x81F.
    pub const TMR0: u32 = 0x818;
    /// Interrupt-request register, bits 31:0; IRR1..IRR7 follow at 0x821..=0x827.
    pub const IRR0: u32 = 0x820;
    /// Error-status register.
    pub const ESR: u32 = 0x828;
    /// LVT corrected-machine-check-interrupt register.
    pub const LVT_CMCI: u32 = 0x82F;
    /// Interrupt-command register (one 64-bit MSR in x2APIC mode).
    pub const ICR: u32 = 0x830;
    /// LVT timer register.
    pub const LVT_TIMER: u32 = 0x832;
    /// LVT thermal-sensor register.
    pub const LVT_THERMAL: u32 = 0x833;
    /// LVT performance-monitoring-counter register.
    pub const LVT_PMI: u32 = 0x834;
    /// LVT LINT0 register.
    pub const LVT_LINT0: u32 = 0x835;
    /// LVT LINT1 register.
    pub const LVT_LINT1: u32 = 0x836;
    /// LVT error register.
    pub const LVT_ERROR: u32 = 0x837;
    /// Timer initial-count register.
    pub const TMICT: u32 = 0x838;
    /// Timer current-count register (read-only).
    pub const TMCCT: u32 = 0x839;
    /// Timer divide-configuration register.
    pub const TDCR: u32 = 0x83E;
    /// SELF IPI register (write-only, x2APIC only).
    pub const SELF_IPI: u32 = 0x83F;
    /// IA32_TSC_DEADLINE: the TSC value at which a TSC-deadline timer fires.
    pub const TSC_DEADLINE: u32 = 0x6E0;
}

/// Clock rates the timer needs.
#[derive(Clone, Copy, Debug)]
pub struct ApicClocks {
    /// APIC timer input clock period before the divider, in picoseconds.
    pub bus_period_ps: u64,
    /// TSC frequency in Hz; the TSC counts from time 0.
    pub tsc_hz: u64,
}

/// What a register write asks the platform to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApicEffect {
    /// Nothing beyond the register change.
    None,
    /// EOI: which ISR bit it cleared (None = nothing was in service; architecturally a no-op)
    Eoi(Option<u8>),
    /// An IPI to route to its destinations.
    SendIpi(Ipi),
    /// timer (re)armed: the platform schedules an expiry event carrying `gen`
    TimerArmed {
        /// When the timer fires.
        deadline: Time,
        /// The arm generation the expiry event must carry to count.
        gen: u64,
    },
    /// The armed timer was disarmed; any scheduled expiry is now stale.
    TimerStopped,
}

/// Why an x2APIC RDMSR or WRMSR fails (where the CPU would raise #GP).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApicError {
    /// The MSR is not an x2APIC register this model knows.
    #[error("MSR {0:#x} is not an x2APIC register")]
    UnknownMsr(u32),
    /// A write to a read-only register.
    #[error("MSR {0:#x} is read-only")]
    ReadOnly(u32),
    /// A read of a write-only register.
    #[error("MSR {0:#x} is write-only")]
    WriteOnly(u32),
    /// A write that sets reserved bits or a reserved encoding. Encodings the
    /// model does not implement (logical destination mode, SMI/INIT/SIPI
    /// delivery) and ICR combinations the SDM calls invalid or unsupported
    /// (table 10-3; a lowest-priority broadcast, 10.6.2.1) are reported
    /// this way too.
    #[error("reserved bits set writing {value:#x} to MSR {msr:#x}")]
    Reserved {
        /// The register written.
        msr: u32,
        /// The rejected value.
        value: u64,
    },
}

/// What the platform learns when a timer expiry event is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerExpiry {
    /// The vector raised in the IRR; None if the LVT entry is masked or its
    /// vector is illegal (0..=15), in which case nothing was requested.
    pub vector: Option<u8>,
    /// The vector was already pending in the IRR, so this expiry merged into it.
    pub merged: bool,
    /// (deadline, gen) of the next expiry for a periodic timer.
    pub rearmed: Option<(Time, u64)>,
}

/// Event counts that a delivery scheme's cost is judged by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LapicCounters {
    /// Fixed interrupts that set a clear IRR bit.
    pub accepted: u64,
    /// Fixed interrupts that found their IRR bit already set and merged.
    pub merged_irr: u64,
    /// Interrupts received (or raised by an LVT entry) with a vector in 0..=15.
    pub illegal_vector: u64,
    /// ICR or SELF IPI writes with a vector in 0..=15, which send nothing.
    pub illegal_vector_sent: u64,
    /// NMIs that set the NMI latch.
    pub nmis_accepted: u64,
    /// NMIs that found the latch set and coalesced.
    pub nmis_merged: u64,
    /// INTA cycles that moved a vector from IRR to ISR.
    pub acks: u64,
    /// EOIs performed, whether or not something was in service.
    pub eois: u64,
    /// EOIs performed with an empty ISR.
    pub eoi_with_empty_isr: u64,
    /// IPIs the ICR or SELF IPI register sent.
    pub ipis_sent: u64,
    /// Timer expiry events taken (stale ones excluded).
    pub timer_expiries: u64,
    /// Periodic expiries that passed while the platform was late taking the
    /// previous one; they merge into the IRR bit the late one set.
    pub timer_missed_periods: u64,
}

/// ESR bit 5: an IPI was written with an illegal vector.
const ESR_SEND_ILLEGAL_VECTOR: u32 = 1 << 5;
/// ESR bit 6: an interrupt was received with an illegal vector.
const ESR_RECEIVE_ILLEGAL_VECTOR: u32 = 1 << 6;

/// LVT mask bit (bit 16), common to all LVT entries.
const LVT_MASKED: u32 = 1 << 16;
/// LVT Timer bits that software may set: vector, mask and timer mode.
const LVT_TIMER_WRITABLE: u64 = 0xFF | (1 << 16) | (0b11 << 17);
/// LINT0/LINT1 writable bits: vector, delivery mode, polarity, trigger, mask.
const LVT_LINT_WRITABLE: u64 = 0x7FF | (1 << 13) | (1 << 15) | (1 << 16);
/// CMCI/thermal/PMI writable bits: vector, delivery mode, mask.
const LVT_LOCAL_WRITABLE: u64 = 0x7FF | (1 << 16);
/// LVT Error writable bits: vector and mask.
const LVT_ERROR_WRITABLE: u64 = 0xFF | (1 << 16);
/// ICR bits the model implements: vector, delivery mode, level, trigger mode,
/// shorthand, and the 32-bit destination. Bit 11 (logical destination) is
/// left out on purpose, as is every bit x2APIC reserves.
const ICR_WRITABLE: u64 = 0xFFFF_FFFF_0000_0000 | 0xFF | (0b111 << 8) | (0b11 << 14) | (0b11 << 18);
/// TDCR bits 0, 1 and 3 hold the divide configuration.
const TDCR_WRITABLE: u64 = 0b1011;
/// SVR: spurious vector and APIC software enable.
const SVR_WRITABLE: u64 = 0x1FF;
/// Version register: version 0x14, seven LVT entries (max index 6), no
/// directed-EOI support.
const VERSION_VALUE: u64 = 0x14 | (6 << 16);

/// The LVT entries besides the timer, by MSR, in the order stored.
const OTHER_LVTS: [(u32, u64); 6] = [
    (msr::LVT_CMCI, LVT_LOCAL_WRITABLE),
    (msr::LVT_THERMAL, LVT_LOCAL_WRITABLE),
    (msr::LVT_PMI, LVT_LOCAL_WRITABLE),
    (msr::LVT_LINT0, LVT_LINT_WRITABLE),
    (msr::LVT_LINT1, LVT_LINT_WRITABLE),
    (msr::LVT_ERROR, LVT_ERROR_WRITABLE),
];

/// The countdown currently armed, if any.
#[derive(Clone, Copy, Debug, Default)]
struct Countdown {
    /// When it fires; None while the timer is stopped.
    deadline: Option<Time>,
    /// One current-count decrement (divide × bus period) of this countdown.
    tick_ps: u64,
    /// The full countdown (initial count × tick) for periodic reloads.
    period: Time,
}

/// The x2APIC local APIC of one core.
#[derive(Clone, Debug)]
pub struct Lapic {
    apic_id: u32,
    clocks: ApicClocks,
    /// Interrupt-request register: vectors accepted but not yet serviced.
    pub irr: ApicBitmap,
    /// In-service register: vectors acknowledged and not yet EOIed.
    pub isr: ApicBitmap,
    /// Trigger-mode register: set for level-triggered vectors, whose EOI the
    /// platform must forward to the I/O APIC.
    pub tmr: ApicBitmap,
    tpr: u8,
    nmi_latched: bool,
    icr: u64,
    svr: u32,
    /// ESR as software last latched it.
    esr: u32,
    /// Errors seen since the last ESR latch write.
    esr_pending: u32,
    lvt_timer: u32,
    other_lvts: [u32; 6],
    tdcr: u32,
    tmict: u32,
    tsc_deadline: u64,
    countdown: Countdown,
    gen: u64,
    mode_change: TimerModeChange,
    counters: LapicCounters,
}

/// Rejects `value` if it has bits outside `writable`, as WRMSR's #GP would.
fn check_bits(msr: u32, value: u64, writable: u64) -> Result<u32, ApicError> {
    if value & !writable != 0 {
        return Err(ApicError::Reserved { msr, value });
    }
    // Every writable mask used with this helper fits in 32 bits.
    Ok(value as u32)
}

/// The divisor a TDCR value selects (SDM Figure 10-10): bits 3 and 1:0 form a
/// three-bit code, 0b111 meaning divide by 1 and code n otherwise 2^(n+1).
pub fn tdcr_divide(tdcr: u32) -> u64 {
    let code = (tdcr & 0b11) | ((tdcr >> 1) & 0b100);
    if code == 0b111 {
        1
    } else {
        2u64 << code
    }
}

impl Lapic {
    /// A local APIC just out of reset: LVT entries masked, TPR 0, timer
    /// stopped in one-shot mode with divide-by-2. Zero clock rates are taken
    /// as 1 (1 ps bus period, 1 Hz TSC) so that no timer computation divides
    /// by zero.
    pub fn new(apic_id: u32, clocks: ApicClocks) -> Self {
        Lapic {
            apic_id,
            clocks: ApicClocks {
                bus_period_ps: clocks.bus_period_ps.max(1),
                tsc_hz: clocks.tsc_hz.max(1),
            },
            irr: ApicBitmap::EMPTY,
            isr: ApicBitmap::EMPTY,
            tmr: ApicBitmap::EMPTY,
            tpr: 0,
            nmi_latched: false,
            icr: 0,
            svr: 0xFF,
            esr: 0,
            esr_pending: 0,
            lvt_timer: LVT_MASKED,
            other_lvts: [LVT_MASKED; 6],
            tdcr: 0,
            tmict: 0,
            tsc_deadline: 0,
            countdown: Countdown::default(),
            gen: 0,
            mode_change: TimerModeChange::Disarm,
            counters: LapicCounters::default(),
        }
    }

    /// The same LAPIC with timer-mode changes handled as `c` says (the
    /// processor's rule unless an emulator asks for its own).
    pub fn with_timer_mode_change(mut self, c: TimerModeChange) -> Self {
        self.mode_change = c;
        self
    }

    /// This core's x2APIC id.
    pub fn apic_id(&self) -> u32 {
        self.apic_id
    }

    /// The clock rates in use (after zero rates were raised to 1).
    pub fn clocks(&self) -> ApicClocks {
        self.clocks
    }

    /// Accepts an edge-triggered fixed interrupt: sets its IRR bit. Returns
    /// false if that IRR bit was already set (the two merge: edge semantics).
    /// Vectors 0..=15 are illegal: the APIC records a receive-illegal-vector
    /// error and drops them, so this returns false.
    pub fn accept_fixed(&mut self, vector: u8) -> bool {
        self.accept(vector, false)
    }

    /// Accepts a fixed interrupt with its trigger mode: like
    /// [`accept_fixed`](Self::accept_fixed), but a level-triggered one also
    /// sets the TMR bit so that its EOI can be forwarded.
    pub fn accept(&mut self, vector: u8, level_triggered: bool) -> bool {
        if vector < 16 {
            self.counters.illegal_vector += 1;
            self.esr_pending |= ESR_RECEIVE_ILLEGAL_VECTOR;
            return false;
        }
        if level_triggered {
            self.tmr.set(vector);
        } else {
            self.tmr.clear(vector);
        }
        if self.irr.test(vector) {
            self.counters.merged_irr += 1;
            false
        } else {
            self.irr.set(vector);
            self.counters.accepted += 1;
            true
        }
    }

    /// Latches an NMI; false if one was already latched (NMIs coalesce).
    pub fn accept_nmi(&mut self) -> bool {
        if self.nmi_latched {
            self.counters.nmis_merged += 1;
            false
        } else {
            self.nmi_latched = true;
            self.counters.nmis_accepted += 1;
            true
        }
    }

    /// Whether an NMI is latched and waiting for the core.
    pub fn nmi_pending(&self) -> bool {
        self.nmi_latched
    }

    /// The core takes the latched NMI: clears the latch, true if it was set.
    pub fn take_nmi(&mut self) -> bool {
        std::mem::take(&mut self.nmi_latched)
    }

    /// The task-priority register.
    pub fn tpr(&self) -> u8 {
        self.tpr
    }

    /// Sets the task-priority register (as MOV to CR8 or a TPR write would).
    pub fn set_tpr(&mut self, v: u8) {
        self.tpr = v;
    }

    /// The processor priority (SDM 10.8.3.1): TPR if `TPR[7:4] >= ISRV[7:4]`,
    /// otherwise `ISRV[7:4]` with the low nibble 0, ISRV being the highest
    /// vector in service (0 if none).
    pub fn ppr(&self) -> u8 {
        let isrv = self.isr.highest().unwrap_or(0);
        if self.tpr >> 4 >= isrv >> 4 {
            self.tpr
        } else {
            isrv & 0xF0
        }
    }

    /// The vector the APIC would present to the core now: the highest IRR
    /// vector, if its priority class is above the PPR's. Lower IRR vectors
    /// are never deliverable when the highest is not.
    #[inline]
    pub fn deliverable(&self) -> Option<u8> {
        // The IRR first: it is mostly empty, and then the PPR is not needed.
        let v = self.irr.highest()?;
        (v >> 4 > self.ppr() >> 4).then_some(v)
    }

    /// INTA cycle: moves [`deliverable`](Self::deliverable) from IRR to ISR
    /// and returns it.
    pub fn ack(&mut self) -> Option<u8> {
        let v = self.deliverable()?;
        self.irr.clear(v);
        self.isr.set(v);
        self.counters.acks += 1;
        Some(v)
    }

    /// EOI: clears the highest ISR bit and returns it; None when the ISR is
    /// empty, which is architecturally a no-op (and counted).
    pub fn eoi(&mut self) -> Option<u8> {
        self.counters.eois += 1;
        let v = self.isr.highest();
        match v {
            Some(v) => self.isr.clear(v),
            None => self.counters.eoi_with_empty_isr += 1,
        }
        v
    }

    /// WRMSR to an x2APIC register (or IA32_TSC_DEADLINE) at time `now`.
    /// An error means the CPU would raise #GP and nothing changed.
    pub fn write_msr(&mut self, msr: u32, value: u64, now: Time) -> Result<ApicEffect, ApicError> {
        match msr {
            msr::TPR => {
                self.tpr = check_bits(msr, value, 0xFF)? as u8;
                Ok(ApicEffect::None)
            }
            msr::EOI => {
                check_bits(msr, value, 0)?;
                Ok(ApicEffect::Eoi(self.eoi()))
            }
            msr::SVR => {
                self.svr = check_bits(msr, value, SVR_WRITABLE)?;
                Ok(ApicEffect::None)
            }
            msr::ESR => {
                // x2APIC: only 0 may be written; the write latches the errors
                // seen since the previous one.
                check_bits(msr, value, 0)?;
                self.esr = std::mem::take(&mut self.esr_pending);
                Ok(ApicEffect::None)
            }
            msr::ICR => self.write_icr(value),
            msr::SELF_IPI => {
                let vector = check_bits(msr, value, 0xFF)? as u8;
                Ok(self.send_ipi(Ipi {
                    dest: IpiDest::SelfOnly,
                    vector,
                    mode: DeliveryMode::Fixed,
                }))
            }
            msr::LVT_TIMER => self.write_lvt_timer(value),
            msr::TDCR => {
                // A new divisor applies from the next arm or periodic reload.
                self.tdcr = check_bits(msr, value, TDCR_WRITABLE)?;
                Ok(ApicEffect::None)
            }
            msr::TMICT => self.write_tmict(value, now),
            msr::TSC_DEADLINE => Ok(self.write_tsc_deadline(value, now)),
            msr::APICID | msr::VERSION | msr::LDR | msr::PPR | msr::TMCCT => {
                Err(ApicError::ReadOnly(msr))
            }
            m if (msr::ISR0..msr::ISR0 + 8).contains(&m)
                || (msr::TMR0..msr::TMR0 + 8).contains(&m)
                || (msr::IRR0..msr::IRR0 + 8).contains(&m) =>
            {
                Err(ApicError::ReadOnly(msr))
            }
            m => match OTHER_LVTS.iter().position(|(r, _)| *r == m) {
                Some(i) => {
                    self.other_lvts[i] = check_bits(msr, value, OTHER_LVTS[i].1)?;
                    Ok(ApicEffect::None)
                }
                None => Err(ApicError::UnknownMsr(msr)),
            },
        }
    }

    /// RDMSR of an x2APIC register (or IA32_TSC_DEADLINE) at time `now`.
    pub fn read_msr(&self, msr: u32, now: Time) -> Result<u64, ApicError> {
        let v = match msr {
            msr::APICID => u64::from(self.apic_id),
            msr::VERSION => VERSION_VALUE,
            msr::TPR => u64::from(self.tpr),
            msr::PPR => u64::from(self.ppr()),
            msr::LDR => u64::from(((self.apic_id >> 4) << 16) | (1 << (self.apic_id & 0xF))),
            msr::SVR => u64::from(self.svr),
            msr::ESR => u64::from(self.esr),
            msr::ICR => self.icr,
            msr::LVT_TIMER => u64::from(self.lvt_timer),
            msr::TMICT => u64::from(self.tmict),
            msr::TMCCT => u64::from(self.current_count(now)),
            msr::TDCR => u64::from(self.tdcr),
            msr::TSC_DEADLINE => {
                // Outside TSC-deadline mode the MSR reads zero.
                if self.timer_mode() == TimerMode::TscDeadline {
                    self.tsc_deadline
                } else {
                    0
                }
            }
            msr::EOI | msr::SELF_IPI => return Err(ApicError::WriteOnly(msr)),
            m if (msr::ISR0..msr::ISR0 + 8).contains(&m) => {
                u64::from(self.isr.chunk32((m - msr::ISR0) as usize))
            }
            m if (msr::TMR0..msr::TMR0 + 8).contains(&m) => {
                u64::from(self.tmr.chunk32((m - msr::TMR0) as usize))
            }
            m if (msr::IRR0..msr::IRR0 + 8).contains(&m) => {
                u64::from(self.irr.chunk32((m - msr::IRR0) as usize))
            }
            m => match OTHER_LVTS.iter().position(|(r, _)| *r == m) {
                Some(i) => u64::from(self.other_lvts[i]),
                None => return Err(ApicError::UnknownMsr(msr)),
            },
        };
        Ok(v)
    }

    /// Decodes an x2APIC ICR write (SDM 10.12.9): vector 7:0, delivery mode
    /// 10:8, shorthand 19:18, destination 63:32.
    fn write_icr(&mut self, value: u64) -> Result<ApicEffect, ApicError> {
        let ipi = decode_icr(value)?;
        self.icr = value;
        Ok(self.send_ipi(ipi))
    }

    /// Sends an IPI unless its vector is illegal, which the APIC reports in
    /// the ESR instead of sending.
    fn send_ipi(&mut self, ipi: Ipi) -> ApicEffect {
        if ipi.mode != DeliveryMode::Nmi && ipi.vector < 16 {
            self.counters.illegal_vector_sent += 1;
            self.esr_pending |= ESR_SEND_ILLEGAL_VECTOR;
            return ApicEffect::None;
        }
        self.counters.ipis_sent += 1;
        ApicEffect::SendIpi(ipi)
    }

    fn write_lvt_timer(&mut self, value: u64) -> Result<ApicEffect, ApicError> {
        let v = check_bits(msr::LVT_TIMER, value, LVT_TIMER_WRITABLE)?;
        let Some(mode) = Self::mode_of(v) else {
            return Err(ApicError::Reserved {
                msr: msr::LVT_TIMER,
                value,
            });
        };
        let old_mode = self.timer_mode();
        self.lvt_timer = v;
        if mode == old_mode {
            return Ok(ApicEffect::None);
        }
        let tsc_deadline_switch =
            (mode == TimerMode::TscDeadline) != (old_mode == TimerMode::TscDeadline);
        match self.mode_change {
            TimerModeChange::Disarm => {
                // A disarmed TSC-deadline timer reads a zero deadline; TMICT
                // is a plain read-write register and keeps its value.
                self.tsc_deadline = 0;
                Ok(self.disarm())
            }
            TimerModeChange::KeepUnlessTscDeadline if tsc_deadline_switch => {
                self.tmict = 0;
                self.tsc_deadline = 0;
                Ok(self.disarm())
            }
            // One-shot <-> periodic: the countdown runs on; timer_expired
            // reloads it or not by the mode in force when it reaches zero.
            TimerModeChange::KeepUnlessTscDeadline => Ok(ApicEffect::None),
        }
    }

    fn write_tmict(&mut self, value: u64, now: Time) -> Result<ApicEffect, ApicError> {
        let count = check_bits(msr::TMICT, value, 0xFFFF_FFFF)?;
        if self.timer_mode() == TimerMode::TscDeadline {
            // The initial count has no meaning in TSC-deadline mode: ignored.
            return Ok(ApicEffect::None);
        }
        self.tmict = count;
        if count == 0 {
            return Ok(self.disarm());
        }
        let tick_ps = self.tick_ps();
        let period = u64::from(count).saturating_mul(tick_ps);
        Ok(self.arm(now.saturating_add(period), tick_ps, period))
    }

    fn write_tsc_deadline(&mut self, value: u64, now: Time) -> ApicEffect {
        if self.timer_mode() != TimerMode::TscDeadline {
            // Writes are ignored outside TSC-deadline mode.
            return ApicEffect::None;
        }
        self.tsc_deadline = value;
        if value == 0 {
            return self.disarm();
        }
        // A deadline already passed fires at once.
        let deadline = self.tsc_to_time(value).max(now);
        self.arm(deadline, 1, 0)
    }

    fn arm(&mut self, deadline: Time, tick_ps: u64, period: Time) -> ApicEffect {
        self.gen += 1;
        self.countdown = Countdown {
            deadline: Some(deadline),
            tick_ps: tick_ps.max(1),
            period,
        };
        ApicEffect::TimerArmed {
            deadline,
            gen: self.gen,
        }
    }

    /// Stops the countdown; TimerStopped only if one was armed.
    fn disarm(&mut self) -> ApicEffect {
        if self.countdown.deadline.take().is_some() {
            ApicEffect::TimerStopped
        } else {
            ApicEffect::None
        }
    }

    fn tick_ps(&self) -> u64 {
        self.timer_divide()
            .saturating_mul(self.clocks.bus_period_ps)
    }

    fn mode_of(lvt: u32) -> Option<TimerMode> {
        match (lvt >> 17) & 0b11 {
            0b00 => Some(TimerMode::OneShot),
            0b01 => Some(TimerMode::Periodic),
            0b10 => Some(TimerMode::TscDeadline),
            _ => None,
        }
    }

    /// The first picosecond at which the TSC reads at least `tsc`:
    /// `tsc × 10^12 / tsc_hz`, rounded up, saturating at the end of time.
    pub fn tsc_to_time(&self, tsc: u64) -> Time {
        let hz = u128::from(self.clocks.tsc_hz);
        let ps = (u128::from(tsc) * u128::from(crate::engine::SEC)).div_ceil(hz);
        Time::try_from(ps).unwrap_or(Time::MAX)
    }

    /// The TSC value at time `now` (what RDTSC returns, with no offset).
    pub fn tsc_at(&self, now: Time) -> u64 {
        let tsc = u128::from(now) * u128::from(self.clocks.tsc_hz) / u128::from(crate::engine::SEC);
        u64::try_from(tsc).unwrap_or(u64::MAX)
    }

    /// The current-count register at `now`: the ticks left in the armed
    /// one-shot or periodic countdown, 0 when stopped, expired or in
    /// TSC-deadline mode.
    fn current_count(&self, now: Time) -> u32 {
        let Some(deadline) = self.countdown.deadline else {
            return 0;
        };
        let remaining = match self.timer_mode() {
            TimerMode::TscDeadline => return 0,
            _ if now < deadline => deadline - now,
            TimerMode::OneShot => 0,
            TimerMode::Periodic => {
                // The expiry is late being taken; the counter has reloaded.
                let period = self.countdown.period.max(1);
                period - (now - deadline) % period
            }
        };
        let count = remaining.div_ceil(self.countdown.tick_ps.max(1));
        count.min(u64::from(self.tmict)) as u32
    }

    /// The timer mode LVT Timer selects.
    pub fn timer_mode(&self) -> TimerMode {
        // Writes of the reserved mode 11 are refused, so it is never stored.
        Self::mode_of(self.lvt_timer).unwrap_or(TimerMode::OneShot)
    }

    /// The vector LVT Timer raises.
    pub fn timer_vector(&self) -> u8 {
        self.lvt_timer as u8
    }

    /// Whether LVT Timer is masked (the timer counts but raises nothing).
    pub fn timer_masked(&self) -> bool {
        self.lvt_timer & LVT_MASKED != 0
    }

    /// The divisor TDCR selects.
    pub fn timer_divide(&self) -> u64 {
        tdcr_divide(self.tdcr)
    }

    /// armed expiry, if any
    pub fn timer_deadline(&self) -> Option<Time> {
        self.countdown.deadline
    }

    /// The generation of the latest arm; only an expiry event carrying it counts.
    pub fn timer_gen(&self) -> u64 {
        self.gen
    }

    /// The platform calls this when a TimerArmed event comes due. Stale `gen` => returns None and changes nothing.
    /// Otherwise: unless LVT masked, sets IRR[timer vector] (merging like accept_fixed). One-shot/TSC-deadline disarm; periodic re-arms (new deadline = old deadline + period) and returns it.
    ///
    /// If the platform takes the event more than a period late, the periods
    /// that passed merge into the same IRR bit and the next deadline is the
    /// first one after `now`.
    pub fn timer_expired(&mut self, now: Time, gen: u64) -> Option<TimerExpiry> {
        let deadline = self.countdown.deadline?;
        if gen != self.gen {
            return None;
        }
        self.counters.timer_expiries += 1;
        let (vector, merged) = if self.timer_masked() {
            (None, false)
        } else {
            let v = self.timer_vector();
            let fresh = self.accept_fixed(v);
            if v < 16 {
                (None, false)
            } else {
                (Some(v), !fresh)
            }
        };
        let rearmed = match self.timer_mode() {
            TimerMode::Periodic => {
                // The reload uses the divisor in force now.
                let tick_ps = self.tick_ps();
                let period = u64::from(self.tmict).saturating_mul(tick_ps).max(1);
                let mut next = deadline.saturating_add(period);
                if next <= now {
                    let missed = (now - next) / period + 1;
                    self.counters.timer_missed_periods += missed;
                    next = next.saturating_add(missed.saturating_mul(period));
                }
                match self.arm(next, tick_ps, period) {
                    ApicEffect::TimerArmed { deadline, gen } => Some((deadline, gen)),
                    _ => None,
                }
            }
            TimerMode::OneShot => {
                self.countdown.deadline = None;
                None
            }
            TimerMode::TscDeadline => {
                // The deadline MSR clears itself when the timer fires.
                self.tsc_deadline = 0;
                self.countdown.deadline = None;
                None
            }
        };
        Some(TimerExpiry {
            vector,
            merged,
            rearmed,
        })
    }

    /// Disarms the timer without touching its registers; a scheduled expiry
    /// event becomes stale.
    pub fn stop_timer(&mut self) {
        self.countdown.deadline = None;
    }

    /// The event counts so far.
    pub fn counters(&self) -> LapicCounters {
        self.counters
    }
}

/// Decodes an x2APIC ICR value into the IPI it asks for (SDM 10.6.1,
/// 10.12.9): delivery mode, shorthand or physical destination, vector (2
/// for NMIs). Reserved encodings are errors; an illegal vector is not (the
/// sending APIC reports it in its ESR). The destination-mode bit is not
/// decoded (the model's destinations are physical).
pub fn decode_icr(value: u64) -> Result<Ipi, ApicError> {
    let reserved = ApicError::Reserved {
        msr: msr::ICR,
        value,
    };
    if value & !ICR_WRITABLE != 0 {
        return Err(reserved);
    }
    let mode = match (value >> 8) & 0b111 {
        0b000 => DeliveryMode::Fixed,
        0b001 => DeliveryMode::LowestPriority,
        0b100 => DeliveryMode::Nmi,
        _ => return Err(reserved),
    };
    let shorthand = (value >> 18) & 0b11;
    let dest = match shorthand {
        0b00 => match (value >> 32) as u32 {
            // The physical broadcast destination (SDM 10.6.2.1): every
            // APIC, the sender included. Lowest-priority delivery to it
            // "is not supported ... and must not be configured".
            X2APIC_BROADCAST_ID if mode == DeliveryMode::LowestPriority => return Err(reserved),
            X2APIC_BROADCAST_ID => IpiDest::AllIncludingSelf,
            id => IpiDest::Physical(id),
        },
        0b01 => IpiDest::SelfOnly,
        0b10 => IpiDest::AllIncludingSelf,
        _ => IpiDest::AllExcludingSelf,
    };
    // The self and all-including-self shorthands are valid with fixed
    // delivery only (SDM table 10-3).
    if matches!(shorthand, 0b01 | 0b10) && mode != DeliveryMode::Fixed {
        return Err(reserved);
    }
    let vector = if mode == DeliveryMode::Nmi {
        2
    } else {
        value as u8
    };
    Ok(Ipi { dest, vector, mode })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{MS, NS};
    use proptest::prelude::*;

    const CLOCKS: ApicClocks = ApicClocks {
        bus_period_ps: 10 * NS, // 100 MHz bus clock
        tsc_hz: 2_500_000_000,  // 400 ps per TSC tick
    };

    fn lapic() -> Lapic {
        Lapic::new(3, CLOCKS)
    }

    /// LVT Timer value for `vector` in `mode`, unmasked.
    fn lvt(vector: u8, mode: u64) -> u64 {
        u64::from(vector) | (mode << 17)
    }

    fn reserved(msr: u32, value: u64) -> ApicError {
        ApicError::Reserved { msr, value }
    }

    #[test]
    fn bitmap_bits_cross_word_boundaries() {
        let mut b = ApicBitmap::default();
        assert!(b.is_empty());
        assert_eq!(b.highest(), None);
        for v in [0u8, 63, 64, 127, 128, 255] {
            b.set(v);
            assert!(b.test(v));
        }
        assert_eq!(b.0, [1 | 1 << 63, 1 | 1 << 63, 1, 1 << 63]);
        assert_eq!(b.count(), 6);
        assert_eq!(b.highest(), Some(255));
        b.clear(255);
        assert_eq!(b.highest(), Some(128));
        b.clear(128);
        assert_eq!(b.highest(), Some(127));
        assert!(!b.test(128));
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![0, 63, 64, 127]);
        assert_eq!(b.chunk32(1), 1 << 31);
        assert_eq!(b.chunk32(2), 1);
        assert_eq!(b.chunk32(8), 0);
    }

    #[test]
    fn reset_state() {
        let a = lapic();
        assert_eq!(a.apic_id(), 3);
        assert_eq!(a.tpr(), 0);
        assert_eq!(a.ppr(), 0);
        assert!(a.timer_masked());
        assert_eq!(a.timer_mode(), TimerMode::OneShot);
        assert_eq!(a.timer_deadline(), None);
        assert_eq!(a.read_msr(msr::LVT_TIMER, 0), Ok(0x1_0000));
        assert_eq!(a.read_msr(msr::LVT_LINT0, 0), Ok(0x1_0000));
        assert_eq!(a.read_msr(msr::APICID, 0), Ok(3));
        assert_eq!(a.read_msr(msr::LDR, 0), Ok(1 << 3));
        assert_eq!(a.read_msr(msr::TMCCT, 0), Ok(0));
        assert_eq!(a.timer_divide(), 2);
        assert!(a.irr.is_empty() && a.isr.is_empty() && !a.nmi_pending());
    }

    #[test]
    fn ldr_derives_cluster_and_bit_from_id() {
        let a = Lapic::new(0x25, CLOCKS);
        assert_eq!(a.read_msr(msr::LDR, 0), Ok((2 << 16) | (1 << 5)));
    }

    #[test]
    fn fixed_interrupts_merge_in_irr() {
        let mut a = lapic();
        assert!(a.accept_fixed(0x40));
        assert!(!a.accept_fixed(0x40));
        assert_eq!(a.irr.count(), 1);
        assert_eq!(a.counters().merged_irr, 1);
        assert_eq!(a.counters().accepted, 1);
        // Once serviced, the same vector can be requested again alongside.
        assert_eq!(a.ack(), Some(0x40));
        assert!(a.accept_fixed(0x40));
        assert!(a.irr.test(0x40) && a.isr.test(0x40));
    }

    #[test]
    fn illegal_vectors_are_dropped_and_reported() {
        let mut a = lapic();
        for v in 0..16u8 {
            assert!(!a.accept_fixed(v));
        }
        assert!(a.irr.is_empty());
        assert_eq!(a.counters().illegal_vector, 16);
        assert!(a.accept_fixed(16));
        // The ESR shows the error only after a latching write of 0.
        assert_eq!(a.read_msr(msr::ESR, 0), Ok(0));
        assert_eq!(a.write_msr(msr::ESR, 0, 0), Ok(ApicEffect::None));
        assert_eq!(
            a.read_msr(msr::ESR, 0),
            Ok(u64::from(ESR_RECEIVE_ILLEGAL_VECTOR))
        );
        assert_eq!(a.write_msr(msr::ESR, 1, 0), Err(reserved(msr::ESR, 1)));
        assert_eq!(a.write_msr(msr::ESR, 0, 0), Ok(ApicEffect::None));
        assert_eq!(a.read_msr(msr::ESR, 0), Ok(0));
    }

    #[test]
    fn level_triggered_sets_tmr_and_edge_clears_it() {
        let mut a = lapic();
        assert!(a.accept(0x50, true));
        assert!(a.tmr.test(0x50));
        assert_eq!(a.read_msr(msr::TMR0 + 2, 0), Ok(1 << 16));
        assert_eq!(a.ack(), Some(0x50));
        assert!(a.accept_fixed(0x50));
        assert!(!a.tmr.test(0x50));
    }

    #[test]
    fn nmis_coalesce_in_one_latch() {
        let mut a = lapic();
        assert!(a.accept_nmi());
        assert!(!a.accept_nmi());
        assert!(a.nmi_pending());
        assert!(a.take_nmi());
        assert!(!a.take_nmi());
        assert!(!a.nmi_pending());
        assert!(a.irr.is_empty());
        assert_eq!(a.counters().nmis_merged, 1);
    }

    #[test]
    fn ppr_follows_tpr_or_isr_class() {
        let mut a = lapic();
        a.isr.set(0x41);
        a.set_tpr(0x35);
        assert_eq!(a.ppr(), 0x40, "ISR class above TPR class: ISRV & 0xF0");
        a.set_tpr(0x45);
        assert_eq!(a.ppr(), 0x45, "equal classes: TPR, low nibble kept");
        a.set_tpr(0x4F);
        assert_eq!(a.ppr(), 0x4F);
        a.set_tpr(0x50);
        assert_eq!(a.ppr(), 0x50);
        a.isr.clear(0x41);
        a.set_tpr(0x07);
        assert_eq!(a.ppr(), 0x07, "empty ISR: TPR");
        assert_eq!(a.read_msr(msr::PPR, 0), Ok(0x07));
    }

    #[test]
    fn ack_refuses_class_not_above_ppr() {
        let mut a = lapic();
        a.set_tpr(0x40);
        a.accept_fixed(0x45);
        a.accept_fixed(0x3F);
        assert_eq!(a.deliverable(), None, "class 4 is not above PPR class 4");
        assert_eq!(a.ack(), None);
        assert!(a.isr.is_empty());
        a.accept_fixed(0x50);
        assert_eq!(a.ack(), Some(0x50));
        assert!(!a.irr.test(0x50) && a.isr.test(0x50));
        // ISR 0x50 now holds PPR at class 5 although TPR is lower.
        a.set_tpr(0);
        a.accept_fixed(0x5F);
        assert_eq!(a.deliverable(), None);
        a.accept_fixed(0x61);
        assert_eq!(a.ack(), Some(0x61));
        assert_eq!(a.ppr(), 0x60);
        assert_eq!(a.counters().acks, 2);
    }

    #[test]
    fn eoi_clears_highest_isr_even_with_higher_irr_pending() {
        let mut a = lapic();
        a.accept_fixed(0x30);
        assert_eq!(a.ack(), Some(0x30));
        a.accept_fixed(0x50);
        assert_eq!(a.ack(), Some(0x50));
        a.accept_fixed(0x90);
        assert_eq!(a.eoi(), Some(0x50));
        assert!(a.irr.test(0x90), "EOI does not touch the IRR");
        assert_eq!(a.write_msr(msr::EOI, 0, 0), Ok(ApicEffect::Eoi(Some(0x30))));
        assert_eq!(a.write_msr(msr::EOI, 0, 0), Ok(ApicEffect::Eoi(None)));
        assert_eq!(a.eoi(), None);
        let c = a.counters();
        assert_eq!((c.eois, c.eoi_with_empty_isr), (4, 2));
    }

    #[test]
    fn eoi_write_must_be_zero() {
        let mut a = lapic();
        a.accept_fixed(0x30);
        a.ack();
        assert_eq!(a.write_msr(msr::EOI, 1, 0), Err(reserved(msr::EOI, 1)));
        assert!(a.isr.test(0x30), "a faulting EOI clears nothing");
    }

    #[test]
    fn access_rights_and_unknown_registers() {
        let mut a = lapic();
        for r in [
            msr::APICID,
            msr::VERSION,
            msr::PPR,
            msr::LDR,
            msr::TMCCT,
            msr::ISR0,
            msr::ISR0 + 7,
            msr::TMR0 + 3,
            msr::IRR0 + 7,
        ] {
            assert_eq!(a.write_msr(r, 0, 0), Err(ApicError::ReadOnly(r)), "{r:#x}");
        }
        for r in [msr::EOI, msr::SELF_IPI] {
            assert_eq!(a.read_msr(r, 0), Err(ApicError::WriteOnly(r)));
        }
        for r in [0x800, 0x801, 0x809, 0x831, 0x840, 0x8FF, 0x900, 0x6E1] {
            assert_eq!(a.read_msr(r, 0), Err(ApicError::UnknownMsr(r)));
            assert_eq!(a.write_msr(r, 0, 0), Err(ApicError::UnknownMsr(r)));
        }
        assert_eq!(a.read_msr(msr::VERSION, 0), Ok(0x0006_0014));
    }

    #[test]
    fn vector_registers_read_in_32_bit_chunks() {
        let mut a = lapic();
        a.accept_fixed(0x21);
        a.accept_fixed(0xFF);
        a.accept_fixed(0x80);
        assert_eq!(a.read_msr(msr::IRR0, 0), Ok(0));
        assert_eq!(a.read_msr(msr::IRR0 + 1, 0), Ok(1 << 1));
        assert_eq!(a.read_msr(msr::IRR0 + 4, 0), Ok(1));
        assert_eq!(a.read_msr(msr::IRR0 + 7, 0), Ok(1 << 31));
        assert_eq!(a.ack(), Some(0xFF));
        assert_eq!(a.read_msr(msr::ISR0 + 7, 0), Ok(1 << 31));
        assert_eq!(a.read_msr(msr::IRR0 + 7, 0), Ok(0));
    }

    #[test]
    fn tpr_register_is_eight_bits() {
        let mut a = lapic();
        assert_eq!(
            a.write_msr(msr::TPR, 0x1FF, 0),
            Err(reserved(msr::TPR, 0x1FF))
        );
        assert_eq!(a.tpr(), 0);
        assert_eq!(a.write_msr(msr::TPR, 0x80, 0), Ok(ApicEffect::None));
        assert_eq!(a.read_msr(msr::TPR, 0), Ok(0x80));
        a.accept_fixed(0x80);
        assert_eq!(a.deliverable(), None);
    }

    #[test]
    fn icr_decodes_modes_and_destinations() {
        let mut a = lapic();
        let send = |a: &mut Lapic, v: u64| a.write_msr(msr::ICR, v, 0);
        let ipi = |dest, vector, mode| Ok(ApicEffect::SendIpi(Ipi { dest, vector, mode }));
        assert_eq!(
            send(&mut a, (7 << 32) | 0x40),
            ipi(IpiDest::Physical(7), 0x40, DeliveryMode::Fixed)
        );
        assert_eq!(a.read_msr(msr::ICR, 0), Ok((7 << 32) | 0x40));
        assert_eq!(
            send(&mut a, (0xABCD_0001 << 32) | (1 << 8) | 0x41),
            ipi(
                IpiDest::Physical(0xABCD_0001),
                0x41,
                DeliveryMode::LowestPriority
            )
        );
        assert_eq!(
            send(&mut a, (2 << 32) | (4 << 8) | 0x99),
            ipi(IpiDest::Physical(2), 2, DeliveryMode::Nmi)
        );
        assert_eq!(
            send(&mut a, (1 << 18) | 0x42),
            ipi(IpiDest::SelfOnly, 0x42, DeliveryMode::Fixed)
        );
        assert_eq!(
            send(&mut a, (2 << 18) | 0x43),
            ipi(IpiDest::AllIncludingSelf, 0x43, DeliveryMode::Fixed)
        );
        assert_eq!(
            send(&mut a, (3 << 18) | (4 << 8)),
            ipi(IpiDest::AllExcludingSelf, 2, DeliveryMode::Nmi)
        );
        // Level and trigger-mode bits are accepted and do not change a fixed IPI.
        assert_eq!(
            send(&mut a, (3 << 14) | 0x44),
            ipi(IpiDest::Physical(0), 0x44, DeliveryMode::Fixed)
        );
        assert_eq!(a.counters().ipis_sent, 7);
    }

    #[test]
    fn icr_rejects_reserved_and_unmodelled_encodings() {
        let mut a = lapic();
        a.write_msr(msr::ICR, 0x40, 0).ok();
        for mode in [0b010u64, 0b011, 0b101, 0b110, 0b111] {
            let v = (mode << 8) | 0x40;
            assert_eq!(a.write_msr(msr::ICR, v, 0), Err(reserved(msr::ICR, v)));
        }
        for v in [
            1u64 << 11,
            1 << 12,
            1 << 13,
            1 << 16,
            1 << 17,
            1 << 20,
            1 << 31,
        ] {
            assert_eq!(
                a.write_msr(msr::ICR, v | 0x40, 0),
                Err(reserved(msr::ICR, v | 0x40))
            );
        }
        let self_nmi = (1 << 18) | (4 << 8);
        assert_eq!(
            a.write_msr(msr::ICR, self_nmi, 0),
            Err(reserved(msr::ICR, self_nmi))
        );
        let self_lowest = (1 << 18) | (1 << 8) | 0x40;
        assert_eq!(
            a.write_msr(msr::ICR, self_lowest, 0),
            Err(reserved(msr::ICR, self_lowest))
        );
        assert_eq!(
            a.read_msr(msr::ICR, 0),
            Ok(0x40),
            "faulting writes leave ICR as it was"
        );
        assert_eq!(a.counters().ipis_sent, 1);
    }

    #[test]
    fn icr_physical_broadcast_destination_is_all_including_self() {
        let mut a = lapic();
        let send = |a: &mut Lapic, v: u64| a.write_msr(msr::ICR, v, 0);
        let all = |vector, mode| {
            Ok(ApicEffect::SendIpi(Ipi {
                dest: IpiDest::AllIncludingSelf,
                vector,
                mode,
            }))
        };
        let bcast = u64::from(X2APIC_BROADCAST_ID) << 32;
        assert_eq!(send(&mut a, bcast | 0x40), all(0x40, DeliveryMode::Fixed));
        assert_eq!(a.read_msr(msr::ICR, 0), Ok(bcast | 0x40));
        assert_eq!(
            send(&mut a, bcast | (4 << 8)),
            all(2, DeliveryMode::Nmi),
            "no shorthand: every delivery mode is valid (table 10-3)"
        );
        // A lowest-priority broadcast is not supported (SDM 10.6.2.1).
        let lowest = bcast | (1 << 8) | 0x40;
        assert_eq!(send(&mut a, lowest), Err(reserved(msr::ICR, lowest)));
        // One below all ones is an ordinary (absent) physical id.
        assert_eq!(
            send(&mut a, (0xFFFF_FFFE << 32) | 0x40),
            Ok(ApicEffect::SendIpi(Ipi {
                dest: IpiDest::Physical(0xFFFF_FFFE),
                vector: 0x40,
                mode: DeliveryMode::Fixed
            }))
        );
        assert_eq!(a.counters().ipis_sent, 3);
    }

    #[test]
    fn all_including_self_shorthand_is_fixed_only() {
        let mut a = lapic();
        for dm in [1u64, 4] {
            let v = (2 << 18) | (dm << 8) | 0x40;
            assert_eq!(a.write_msr(msr::ICR, v, 0), Err(reserved(msr::ICR, v)));
        }
        // All-excluding-self takes every modelled mode (table 10-3).
        for dm in [0u64, 1, 4] {
            let v = (3 << 18) | (dm << 8) | 0x40;
            assert!(matches!(
                a.write_msr(msr::ICR, v, 0),
                Ok(ApicEffect::SendIpi(_))
            ));
        }
    }

    #[test]
    fn icr_illegal_vector_sends_nothing() {
        let mut a = lapic();
        assert_eq!(
            a.write_msr(msr::ICR, (5 << 32) | 0x0F, 0),
            Ok(ApicEffect::None)
        );
        assert_eq!(
            a.write_msr(msr::ICR, (1 << 8) | 0x01, 0),
            Ok(ApicEffect::None)
        );
        assert_eq!(a.counters().illegal_vector_sent, 2);
        assert_eq!(a.counters().ipis_sent, 0);
        a.write_msr(msr::ESR, 0, 0).ok();
        assert_eq!(
            a.read_msr(msr::ESR, 0),
            Ok(u64::from(ESR_SEND_ILLEGAL_VECTOR))
        );
        // An NMI's vector field is ignored, so 0 is fine.
        assert!(matches!(
            a.write_msr(msr::ICR, 4 << 8, 0),
            Ok(ApicEffect::SendIpi(_))
        ));
    }

    #[test]
    fn self_ipi_register() {
        let mut a = lapic();
        assert_eq!(
            a.write_msr(msr::SELF_IPI, 0x55, 0),
            Ok(ApicEffect::SendIpi(Ipi {
                dest: IpiDest::SelfOnly,
                vector: 0x55,
                mode: DeliveryMode::Fixed
            }))
        );
        assert_eq!(
            a.write_msr(msr::SELF_IPI, 0x155, 0),
            Err(reserved(msr::SELF_IPI, 0x155))
        );
        assert_eq!(a.write_msr(msr::SELF_IPI, 0x05, 0), Ok(ApicEffect::None));
        assert_eq!(a.counters().illegal_vector_sent, 1);
    }

    #[test]
    fn tdcr_divide_table() {
        let table = [
            (0b0000u64, 2u64),
            (0b0001, 4),
            (0b0010, 8),
            (0b0011, 16),
            (0b1000, 32),
            (0b1001, 64),
            (0b1010, 128),
            (0b1011, 1),
        ];
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        for (code, div) in table {
            assert_eq!(a.write_msr(msr::TDCR, code, 0), Ok(ApicEffect::None));
            assert_eq!(a.read_msr(msr::TDCR, 0), Ok(code));
            assert_eq!(a.timer_divide(), div);
            let now = 5 * NS;
            match a.write_msr(msr::TMICT, 10, now) {
                Ok(ApicEffect::TimerArmed { deadline, .. }) => {
                    assert_eq!(
                        deadline,
                        now + 10 * div * CLOCKS.bus_period_ps,
                        "code {code:#06b}"
                    )
                }
                other => panic!("TMICT write gave {other:?}"),
            }
        }
        for bad in [0b0100u64, 0b10000, 1 << 32] {
            assert_eq!(
                a.write_msr(msr::TDCR, bad, 0),
                Err(reserved(msr::TDCR, bad))
            );
        }
    }

    #[test]
    fn tmcct_counts_down_to_zero() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        // Divide by 2 (reset) over a 10 ns bus: one tick every 20 ns.
        let t0 = MS;
        let eff = a.write_msr(msr::TMICT, 1000, t0);
        assert_eq!(
            eff,
            Ok(ApicEffect::TimerArmed {
                deadline: t0 + 20_000 * NS,
                gen: 1
            })
        );
        assert_eq!(a.read_msr(msr::TMICT, t0), Ok(1000));
        assert_eq!(a.read_msr(msr::TMCCT, t0), Ok(1000));
        assert_eq!(a.read_msr(msr::TMCCT, t0 + 250 * 20 * NS), Ok(750));
        let mut last = u64::MAX;
        for step in 0..=100 {
            let c = a
                .read_msr(msr::TMCCT, t0 + step * 200 * NS)
                .unwrap_or(u64::MAX);
            assert!(c <= last, "TMCCT rose from {last} to {c}");
            last = c;
        }
        assert_eq!(a.read_msr(msr::TMCCT, t0 + 20_000 * NS - 1), Ok(1));
        assert_eq!(a.read_msr(msr::TMCCT, t0 + 20_000 * NS), Ok(0));
        assert_eq!(a.read_msr(msr::TMCCT, t0 + 30_000 * NS), Ok(0));
    }

    #[test]
    fn one_shot_fires_once() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0xEC, 0), 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 100, 0) else {
            panic!("not armed");
        };
        assert_eq!(a.timer_deadline(), Some(deadline));
        let e = a.timer_expired(deadline, gen);
        assert_eq!(
            e,
            Some(TimerExpiry {
                vector: Some(0xEC),
                merged: false,
                rearmed: None
            })
        );
        assert!(a.irr.test(0xEC));
        assert_eq!(a.timer_deadline(), None);
        assert_eq!(a.read_msr(msr::TMCCT, deadline), Ok(0));
        assert_eq!(
            a.timer_expired(deadline, gen),
            None,
            "a one-shot does not fire twice"
        );
        assert_eq!(a.counters().timer_expiries, 1);
    }

    #[test]
    fn periodic_rearms_and_stale_gen_is_ignored() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0xEF, 1), 0).ok();
        a.write_msr(msr::TDCR, 0b1011, 0).ok(); // divide by 1: 10 ns per tick
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 50, 0) else {
            panic!("not armed");
        };
        assert_eq!(deadline, 500 * NS);
        let e = a
            .timer_expired(deadline, gen)
            .unwrap_or_else(|| panic!("fresh gen ignored"));
        assert_eq!(e.vector, Some(0xEF));
        let (next, gen2) = e
            .rearmed
            .unwrap_or_else(|| panic!("periodic did not re-arm"));
        assert_eq!(next, deadline + 500 * NS);
        assert_eq!(gen2, gen + 1);
        assert_eq!(a.timer_gen(), gen2);
        assert_eq!(a.timer_deadline(), Some(next));
        assert_eq!(
            a.read_msr(msr::TMCCT, deadline),
            Ok(50),
            "the counter reloads"
        );
        // The old event again: stale, nothing changes.
        let irr = a.irr;
        assert_eq!(a.timer_expired(deadline, gen), None);
        assert_eq!(a.timer_deadline(), Some(next));
        assert_eq!(a.irr, irr);
        // Not serviced yet: the next period merges.
        let e2 = a
            .timer_expired(next, gen2)
            .unwrap_or_else(|| panic!("fresh gen ignored"));
        assert!(e2.merged);
        assert_eq!(a.counters().merged_irr, 1);
        assert_eq!(e2.rearmed, Some((next + 500 * NS, gen2 + 1)));
    }

    #[test]
    fn periodic_taken_late_skips_whole_periods() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0xEF, 1), 0).ok();
        a.write_msr(msr::TDCR, 0b1011, 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        // 100 ns period; taken 350 ns late.
        assert_eq!(a.read_msr(msr::TMCCT, deadline + 350 * NS), Ok(5));
        let e = a
            .timer_expired(deadline + 350 * NS, gen)
            .unwrap_or_else(|| panic!("ignored"));
        assert_eq!(e.rearmed.map(|r| r.0), Some(deadline + 400 * NS));
        assert_eq!(a.counters().timer_missed_periods, 3);
    }

    #[test]
    fn masked_timer_raises_nothing_but_keeps_counting() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0xEF, 1) | (1 << 16), 0)
            .ok();
        assert!(a.timer_masked());
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        let e = a
            .timer_expired(deadline, gen)
            .unwrap_or_else(|| panic!("ignored"));
        assert_eq!(e.vector, None);
        assert!(!e.merged);
        assert!(e.rearmed.is_some());
        assert!(a.irr.is_empty());
    }

    #[test]
    fn illegal_timer_vector_is_a_receive_error() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x05, 0), 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 1, 0) else {
            panic!("not armed");
        };
        let e = a
            .timer_expired(deadline, gen)
            .unwrap_or_else(|| panic!("ignored"));
        assert_eq!(e.vector, None);
        assert!(a.irr.is_empty());
        assert_eq!(a.counters().illegal_vector, 1);
    }

    #[test]
    fn zero_initial_count_stops_the_timer() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        assert_eq!(
            a.write_msr(msr::TMICT, 0, 0),
            Ok(ApicEffect::None),
            "nothing was armed"
        );
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        assert_eq!(a.write_msr(msr::TMICT, 0, 0), Ok(ApicEffect::TimerStopped));
        assert_eq!(a.timer_deadline(), None);
        assert_eq!(a.timer_expired(deadline, gen), None);
        assert!(a.irr.is_empty());
        assert_eq!(
            a.write_msr(msr::TMICT, 1 << 32, 0),
            Err(reserved(msr::TMICT, 1 << 32))
        );
    }

    #[test]
    fn rearming_makes_the_old_event_stale() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        let Ok(ApicEffect::TimerArmed {
            deadline: d1,
            gen: g1,
        }) = a.write_msr(msr::TMICT, 10, 0)
        else {
            panic!("not armed");
        };
        let Ok(ApicEffect::TimerArmed {
            deadline: d2,
            gen: g2,
        }) = a.write_msr(msr::TMICT, 20, 0)
        else {
            panic!("not armed");
        };
        assert!(g2 > g1 && d2 > d1);
        assert_eq!(a.timer_expired(d1, g1), None);
        assert!(a.timer_expired(d2, g2).is_some());
    }

    #[test]
    fn lvt_timer_mode_change_stops_the_timer() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        // Same mode, new vector and mask: keeps counting.
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x31, 0) | (1 << 16), 0),
            Ok(ApicEffect::None)
        );
        assert_eq!(a.timer_deadline(), Some(deadline));
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x31, 1), 0),
            Ok(ApicEffect::TimerStopped)
        );
        assert_eq!(a.timer_mode(), TimerMode::Periodic);
        assert_eq!(a.timer_vector(), 0x31);
        assert_eq!(a.timer_expired(deadline, gen), None);
        // SDM 10.5.4.1 disarms the timer and says nothing of the initial
        // count: TMICT keeps it, the current count is 0.
        assert_eq!(a.read_msr(msr::TMICT, 0), Ok(10));
        assert_eq!(a.read_msr(msr::TMCCT, 1), Ok(0));
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x31, 3), 0),
            Err(reserved(msr::LVT_TIMER, lvt(0x31, 3)))
        );
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, 1 << 12, 0),
            Err(reserved(msr::LVT_TIMER, 1 << 12))
        );
        assert_eq!(a.timer_mode(), TimerMode::Periodic);
    }

    /// The processor: every mode change disarms (one-shot <-> periodic
    /// included), TMICT survives it, and the next TMICT write re-arms.
    #[test]
    fn hardware_mode_change_disarms_and_keeps_the_initial_count() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 1), 0).ok();
        assert!(matches!(
            a.write_msr(msr::TMICT, 1000, 0),
            Ok(ApicEffect::TimerArmed { .. })
        ));
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0),
            Ok(ApicEffect::TimerStopped),
            "periodic -> one-shot"
        );
        assert_eq!(a.read_msr(msr::TMICT, 0), Ok(1000));
        assert_eq!(a.timer_deadline(), None);
        // Into and out of TSC-deadline mode: disarmed too.
        let Ok(ApicEffect::TimerArmed { .. }) = a.write_msr(msr::TMICT, 1000, 0) else {
            panic!("not armed");
        };
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 2), 0),
            Ok(ApicEffect::TimerStopped)
        );
        a.write_msr(msr::TSC_DEADLINE, 1_000_000, 0).ok();
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0),
            Ok(ApicEffect::TimerStopped)
        );
        assert_eq!(a.read_msr(msr::TMICT, 0), Ok(1000));
        let Ok(ApicEffect::TimerArmed { deadline, .. }) = a.write_msr(msr::TMICT, 5, 7) else {
            panic!("TMICT re-arms after the mode change");
        };
        assert_eq!(deadline, 7 + 5 * 2 * CLOCKS.bus_period_ps);
    }

    /// KVM's emulation (`apic_update_lvtt`): one-shot <-> periodic keeps
    /// the countdown and the new mode applies when it expires, as
    /// kvm-unit-tests' `test_apic_change_mode` checks; TSC-deadline
    /// switches cancel and zero TMICT.
    #[test]
    fn kvm_mode_change_keeps_the_countdown_between_one_shot_and_periodic() {
        let mut a = lapic().with_timer_mode_change(TimerModeChange::KeepUnlessTscDeadline);
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        let period = 10 * 2 * CLOCKS.bus_period_ps;
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 1), period / 2),
            Ok(ApicEffect::None),
            "one-shot -> periodic keeps counting"
        );
        assert_eq!(
            a.read_msr(msr::TMCCT, period / 2),
            Ok(5),
            "not reset to TMICT"
        );
        // Expiry in the new (periodic) mode reloads from TMICT.
        let e = a.timer_expired(deadline, gen).expect("still armed");
        let (next, gen) = e.rearmed.expect("periodic now");
        assert_eq!(next, deadline + period);
        // Periodic -> one-shot: the current countdown ends and stays at 0.
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), deadline),
            Ok(ApicEffect::None)
        );
        let e = a.timer_expired(next, gen).expect("still armed");
        assert_eq!(e.rearmed, None);
        assert_eq!(a.read_msr(msr::TMCCT, next + 1), Ok(0));
        // An expired one-shot switched to periodic stays at zero.
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 1), next + 1),
            Ok(ApicEffect::None)
        );
        assert_eq!(a.timer_deadline(), None);
        assert_eq!(a.read_msr(msr::TMICT, 0), Ok(10));
        // Into TSC-deadline mode: cancelled, TMICT zeroed.
        let Ok(ApicEffect::TimerArmed { .. }) = a.write_msr(msr::TMICT, 10, next + 1) else {
            panic!("not armed");
        };
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 2), next + 2),
            Ok(ApicEffect::TimerStopped)
        );
        assert_eq!(a.read_msr(msr::TMICT, 0), Ok(0));
    }

    #[test]
    fn tsc_deadline_converts_and_fires() {
        let mut a = lapic();
        // Outside TSC-deadline mode the MSR ignores writes and reads 0.
        assert_eq!(
            a.write_msr(msr::TSC_DEADLINE, 1000, 0),
            Ok(ApicEffect::None)
        );
        assert_eq!(a.read_msr(msr::TSC_DEADLINE, 0), Ok(0));
        a.write_msr(msr::LVT_TIMER, lvt(0xEC, 2), 0).ok();
        assert_eq!(a.timer_mode(), TimerMode::TscDeadline);
        // 2.5 GHz: 2.5e6 TSC ticks are 1 ms.
        let eff = a.write_msr(msr::TSC_DEADLINE, 2_500_000, 0);
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = eff else {
            panic!("not armed: {eff:?}");
        };
        assert_eq!(deadline, MS);
        assert_eq!(a.read_msr(msr::TSC_DEADLINE, 0), Ok(2_500_000));
        assert_eq!(a.read_msr(msr::TMCCT, 0), Ok(0));
        // TMICT means nothing in this mode.
        assert_eq!(a.write_msr(msr::TMICT, 5, 0), Ok(ApicEffect::None));
        assert_eq!(a.timer_deadline(), Some(MS));
        let e = a
            .timer_expired(deadline, gen)
            .unwrap_or_else(|| panic!("ignored"));
        assert_eq!(
            e,
            TimerExpiry {
                vector: Some(0xEC),
                merged: false,
                rearmed: None
            }
        );
        assert_eq!(
            a.read_msr(msr::TSC_DEADLINE, deadline),
            Ok(0),
            "cleared when it fires"
        );
        assert_eq!(a.timer_deadline(), None);
    }

    #[test]
    fn tsc_deadline_in_the_past_fires_now_and_zero_disarms() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0xEC, 2), 0).ok();
        let now = 5 * MS;
        assert_eq!(
            a.write_msr(msr::TSC_DEADLINE, 1, now),
            Ok(ApicEffect::TimerArmed {
                deadline: now,
                gen: 1
            })
        );
        assert_eq!(
            a.write_msr(msr::TSC_DEADLINE, 0, now),
            Ok(ApicEffect::TimerStopped)
        );
        assert_eq!(a.timer_deadline(), None);
        assert_eq!(a.timer_expired(now, 1), None);
        // Leaving TSC-deadline mode disarms too.
        a.write_msr(msr::TSC_DEADLINE, u64::MAX, now).ok();
        assert_eq!(
            a.timer_deadline(),
            Some(Time::MAX),
            "saturates instead of overflowing"
        );
        assert_eq!(
            a.write_msr(msr::LVT_TIMER, lvt(0xEC, 0), now),
            Ok(ApicEffect::TimerStopped)
        );
    }

    #[test]
    fn tsc_conversion_rounds_up_to_the_first_picosecond_reached() {
        let a = Lapic::new(
            0,
            ApicClocks {
                bus_period_ps: 1,
                tsc_hz: 3_000_000_000,
            },
        );
        assert_eq!(a.tsc_to_time(3), 1_000);
        assert_eq!(a.tsc_to_time(1), 334);
        assert_eq!(a.tsc_at(334), 1);
        assert_eq!(a.tsc_at(333), 0);
        // Zero clock rates cannot divide by zero.
        let z = Lapic::new(
            0,
            ApicClocks {
                bus_period_ps: 0,
                tsc_hz: 0,
            },
        );
        assert_eq!(z.tsc_to_time(1), crate::engine::SEC);
    }

    #[test]
    fn stop_timer_makes_the_event_stale() {
        let mut a = lapic();
        a.write_msr(msr::LVT_TIMER, lvt(0x30, 1), 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, gen }) = a.write_msr(msr::TMICT, 10, 0) else {
            panic!("not armed");
        };
        a.stop_timer();
        assert_eq!(a.timer_expired(deadline, gen), None);
        assert_eq!(a.read_msr(msr::TMCCT, 0), Ok(0));
    }

    #[test]
    fn other_lvts_and_svr_store_writable_bits() {
        let mut a = lapic();
        assert_eq!(a.write_msr(msr::LVT_LINT1, 4 << 8, 0), Ok(ApicEffect::None));
        assert_eq!(a.read_msr(msr::LVT_LINT1, 0), Ok(4 << 8));
        assert_eq!(
            a.write_msr(msr::LVT_ERROR, 1 << 8, 0),
            Err(reserved(msr::LVT_ERROR, 1 << 8))
        );
        assert_eq!(a.write_msr(msr::SVR, 0x1FF, 0), Ok(ApicEffect::None));
        assert_eq!(a.read_msr(msr::SVR, 0), Ok(0x1FF));
        assert_eq!(
            a.write_msr(msr::SVR, 1 << 12, 0),
            Err(reserved(msr::SVR, 1 << 12))
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Accept(u8),
        Ack,
        Eoi,
        SetTpr(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::Accept),
            Just(Op::Ack),
            Just(Op::Eoi),
            any::<u8>().prop_map(Op::SetTpr),
        ]
    }

    proptest! {
        /// Priority arbitration: ack only takes the highest IRR vector and
        /// only above the PPR class, EOI retires exactly the highest ISR bit,
        /// and so the ISR never holds two vectors of one priority class.
        #[test]
        fn arbitration_rules_hold(ops in proptest::collection::vec(op(), 0..200)) {
            let mut a = lapic();
            for op in ops {
                match op {
                    Op::Accept(v) => {
                        let was = a.irr.test(v);
                        let fresh = a.accept_fixed(v);
                        prop_assert_eq!(fresh, v >= 16 && !was);
                        prop_assert_eq!(a.irr.test(v), v >= 16 || was);
                    }
                    Op::Ack => {
                        let ppr = a.ppr();
                        let top = a.irr.highest();
                        match a.ack() {
                            Some(v) => {
                                prop_assert!(v >> 4 > ppr >> 4);
                                prop_assert_eq!(Some(v), top);
                                prop_assert!(a.isr.test(v));
                            }
                            None => prop_assert!(top.is_none_or(|t| t >> 4 <= ppr >> 4)),
                        }
                    }
                    Op::Eoi => {
                        let top = a.isr.highest();
                        prop_assert_eq!(a.eoi(), top);
                        if let Some(v) = top {
                            prop_assert!(!a.isr.test(v));
                        }
                    }
                    Op::SetTpr(t) => a.set_tpr(t),
                }
                for class in 0..16u8 {
                    let in_class = (class * 16..=class * 16 + 15).filter(|v| a.isr.test(*v)).count();
                    prop_assert!(in_class <= 1, "class {} has {} vectors in service", class, in_class);
                }
                let ppr = a.ppr();
                prop_assert!(ppr >> 4 >= a.tpr() >> 4);
                prop_assert!(ppr >> 4 >= a.isr.highest().unwrap_or(0) >> 4);
            }
        }

        /// The bitmap agrees with a set model on membership, count and maximum.
        #[test]
        fn bitmap_matches_set_model(ops in proptest::collection::vec((any::<bool>(), any::<u8>()), 0..300)) {
            let mut b = ApicBitmap::default();
            let mut model = std::collections::BTreeSet::new();
            for (set, v) in ops {
                if set { b.set(v); model.insert(v); } else { b.clear(v); model.remove(&v); }
                prop_assert_eq!(b.highest(), model.iter().next_back().copied());
                prop_assert_eq!(b.count() as usize, model.len());
                prop_assert_eq!(b.is_empty(), model.is_empty());
            }
            prop_assert_eq!(b.iter().collect::<Vec<_>>(), model.into_iter().collect::<Vec<_>>());
        }

        /// The word-wise scan yields exactly the vectors a bit-by-bit test of
        /// all 256 finds, in the same order; the word-wise union is the
        /// bit-by-bit one.
        #[test]
        fn wordwise_iter_and_union_equal_bit_by_bit(a in any::<[u64; 4]>(), b in any::<[u64; 4]>(), sparse in any::<[u8; 4]>()) {
            // Dense random words and sparse ones (a few bits per word).
            for words in [a, [a[0] & b[0] & u64::from(sparse[0]), a[1] & b[1] & (u64::from(sparse[1]) << 56), 0, b[3] & a[3] & b[2]]] {
                let x = ApicBitmap(words);
                let bitwise: Vec<u8> = (0..=255u8).filter(|v| x.test(*v)).collect();
                prop_assert_eq!(x.highest(), bitwise.last().copied());
                prop_assert_eq!(x.iter().collect::<Vec<_>>(), bitwise);
                let mut u = ApicBitmap(b);
                u.union_with(&x);
                let mut r = ApicBitmap(b);
                for v in (0..=255u8).filter(|v| x.test(*v)) {
                    r.set(v);
                }
                prop_assert_eq!(u, r);
            }
        }

        /// TMCCT never rises while a one-shot countdown runs, and starts at
        /// the initial count.
        #[test]
        fn tmcct_is_monotone(count in 1u32.., code in 0u64..8, t0 in 0u64..1_000_000_000, steps in proptest::collection::vec(0u64..1_000_000_000_000, 1..20)) {
            let mut a = lapic();
            a.write_msr(msr::LVT_TIMER, lvt(0x30, 0), 0).ok();
            let tdcr = (code & 0b11) | ((code & 0b100) << 1);
            prop_assert!(a.write_msr(msr::TDCR, tdcr, 0).is_ok());
            prop_assert!(a.write_msr(msr::TMICT, u64::from(count), t0).is_ok());
            prop_assert_eq!(a.read_msr(msr::TMCCT, t0), Ok(u64::from(count)));
            let mut times: Vec<u64> = steps.into_iter().map(|s| t0 + s).collect();
            times.sort_unstable();
            let mut last = u64::from(count);
            for t in times {
                let c = a.read_msr(msr::TMCCT, t);
                prop_assert!(c.as_ref().is_ok_and(|c| *c <= last));
                last = c.unwrap_or(0);
            }
        }
    }
}
