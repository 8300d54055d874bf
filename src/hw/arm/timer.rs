//! The Arm generic timer of one core: the EL1 physical and virtual timers
//! (Arm ARM D11 "The Generic Timer in AArch64 state"; did-arm.md §2.4,
//! kvm-arm-and-peers.md §2 "Arch timer").
//!
//! The system counter (CNTPCT_EL0) counts at CNTFRQ_EL0 from simulated time
//! 0; the virtual counter is CNTVCT_EL0 = CNTPCT_EL0 − CNTVOFF_EL2. Each
//! timer has a 64-bit compare value (CVAL), a signed 32-bit view of it
//! relative to the counter (TVAL) and a control register (ENABLE, IMASK, and
//! the read-only ISTATUS, set while the counter is at or past CVAL). The
//! timer's output — ISTATUS && !IMASK — is the level of its PPI: 27 for the
//! virtual timer, 30 for the physical one.
//!
//! A guest programs its virtual timer directly (no exit, unlike x86's
//! TSC-deadline MSR). Like the LAPIC model, the timer only reads time: each
//! write returns the level now and, if the output will rise later, the time
//! it does so with a generation number; the platform schedules an event and
//! calls [`GenericTimer::expired`], which ignores events of a stale
//! generation.

use crate::engine::{Time, SEC};
use crate::hw::arm::intid::{PTIMER_PPI, VTIMER_PPI};
use crate::hw::arm::params::TimerParams;

/// CNTx_CTL_EL0.ENABLE.
pub const CTL_ENABLE: u64 = 1 << 0;
/// CNTx_CTL_EL0.IMASK.
pub const CTL_IMASK: u64 = 1 << 1;
/// CNTx_CTL_EL0.ISTATUS (read-only).
pub const CTL_ISTATUS: u64 = 1 << 2;

/// One of the two EL1 timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimerChannel {
    /// CNTV: compares against the virtual counter; PPI 27.
    Virtual,
    /// CNTP: compares against the physical counter; PPI 30.
    Physical,
}

impl TimerChannel {
    /// The PPI its output drives.
    pub fn ppi(self) -> u32 {
        match self {
            TimerChannel::Virtual => VTIMER_PPI,
            TimerChannel::Physical => PTIMER_PPI,
        }
    }

    fn index(self) -> usize {
        match self {
            TimerChannel::Virtual => 0,
            TimerChannel::Physical => 1,
        }
    }
}

/// The timer system registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CntReg {
    /// CNTFRQ_EL0 (read-only here: firmware sets it).
    Frq,
    /// CNTPCT_EL0 (read-only).
    Pct,
    /// CNTVCT_EL0 (read-only).
    Vct,
    /// CNTVOFF_EL2 (EL2 only).
    Voff,
    /// CNTV_CTL_EL0.
    VCtl,
    /// CNTV_CVAL_EL0.
    VCval,
    /// CNTV_TVAL_EL0.
    VTval,
    /// CNTP_CTL_EL0.
    PCtl,
    /// CNTP_CVAL_EL0.
    PCval,
    /// CNTP_TVAL_EL0.
    PTval,
}

/// Why a timer register write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimerError {
    /// A write to a read-only register.
    #[error("{0:?} is read-only")]
    ReadOnly(CntReg),
    /// Reserved bits set.
    #[error("reserved bits set writing {value:#x} to {reg:?}")]
    Reserved {
        /// The register.
        reg: CntReg,
        /// The value refused.
        value: u64,
    },
}

/// What a register write (or an expiry) means for the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerUpdate {
    /// The timer concerned.
    pub channel: TimerChannel,
    /// Its output level now (the PPI line to drive).
    pub level: bool,
    /// When the output will rise, and the generation the event must carry;
    /// None if it will not rise without another write (disabled, masked,
    /// already firing, or beyond the end of time). Any event scheduled
    /// before is stale either way.
    pub arm: Option<(Time, u64)>,
}

/// Event counts of one core's timers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerCounters {
    /// Register writes that reprogrammed a timer.
    pub writes: u64,
    /// Expiry events taken that found the output high.
    pub fired: u64,
    /// Expiry events of a stale generation (ignored).
    pub stale: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Channel {
    ctl: u64,
    cval: u64,
    gen: u64,
}

/// One core's generic timer (the EL1 virtual and physical timers).
#[derive(Clone, Debug)]
pub struct GenericTimer {
    frequency_hz: u64,
    cntvoff: u64,
    chan: [Channel; 2],
    counters: TimerCounters,
}

impl GenericTimer {
    /// Both timers disabled, CNTVOFF 0. A zero frequency is taken as 1 Hz.
    pub fn new(params: &TimerParams) -> Self {
        GenericTimer {
            frequency_hz: params.frequency_hz.max(1),
            cntvoff: 0,
            chan: [Channel::default(); 2],
            counters: TimerCounters::default(),
        }
    }

    /// Event counts so far.
    pub fn counters(&self) -> TimerCounters {
        self.counters
    }

    /// CNTPCT_EL0 at `now`.
    pub fn cntpct(&self, now: Time) -> u64 {
        let c = u128::from(now) * u128::from(self.frequency_hz) / u128::from(SEC);
        u64::try_from(c).unwrap_or(u64::MAX)
    }

    /// CNTVCT_EL0 at `now`: the physical count less CNTVOFF_EL2.
    pub fn cntvct(&self, now: Time) -> u64 {
        self.cntpct(now).wrapping_sub(self.cntvoff)
    }

    /// CNTVOFF_EL2.
    pub fn cntvoff(&self) -> u64 {
        self.cntvoff
    }

    fn count(&self, ch: TimerChannel, now: Time) -> u64 {
        match ch {
            TimerChannel::Virtual => self.cntvct(now),
            TimerChannel::Physical => self.cntpct(now),
        }
    }

    /// ISTATUS: enabled and the counter at or past CVAL.
    pub fn istatus(&self, ch: TimerChannel, now: Time) -> bool {
        let c = self.chan[ch.index()];
        c.ctl & CTL_ENABLE != 0 && self.count(ch, now) >= c.cval
    }

    /// The output level (ISTATUS && !IMASK): the PPI's line.
    pub fn output(&self, ch: TimerChannel, now: Time) -> bool {
        self.istatus(ch, now) && self.chan[ch.index()].ctl & CTL_IMASK == 0
    }

    /// The first time at or after which the physical counter reads at least
    /// `count`; None past the end of time.
    fn time_of_count(&self, count: u64) -> Option<Time> {
        let t = (u128::from(count) * u128::from(SEC)).div_ceil(u128::from(self.frequency_hz));
        Time::try_from(t).ok()
    }

    /// When the output of `ch` will rise if nothing is written meanwhile:
    /// None if disabled, masked, already high, or never.
    pub fn next_fire(&self, ch: TimerChannel, now: Time) -> Option<Time> {
        let c = self.chan[ch.index()];
        if c.ctl & CTL_ENABLE == 0 || c.ctl & CTL_IMASK != 0 || self.istatus(ch, now) {
            return None;
        }
        let physical = match ch {
            TimerChannel::Virtual => c.cval.checked_add(self.cntvoff)?,
            TimerChannel::Physical => c.cval,
        };
        self.time_of_count(physical).map(|t| t.max(now))
    }

    /// The current generation of `ch`'s scheduling.
    pub fn gen(&self, ch: TimerChannel) -> u64 {
        self.chan[ch.index()].gen
    }

    fn update(&mut self, ch: TimerChannel, now: Time) -> TimerUpdate {
        self.counters.writes += 1;
        let c = &mut self.chan[ch.index()];
        c.gen += 1;
        let gen = c.gen;
        TimerUpdate {
            channel: ch,
            level: self.output(ch, now),
            arm: self.next_fire(ch, now).map(|t| (t, gen)),
        }
    }

    /// The platform takes a scheduled expiry of `ch` carrying `gen`. A stale
    /// generation changes nothing and returns None; otherwise the output
    /// level now (true when the timer fires; the level holds until software
    /// reprograms or masks the timer).
    pub fn expired(&mut self, ch: TimerChannel, now: Time, gen: u64) -> Option<bool> {
        if gen != self.gen(ch) {
            self.counters.stale += 1;
            return None;
        }
        let level = self.output(ch, now);
        self.counters.fired += u64::from(level);
        Some(level)
    }

    /// An MRS of a timer register at `now`.
    pub fn read(&self, reg: CntReg, now: Time) -> u64 {
        let ctl = |ch: TimerChannel| {
            self.chan[ch.index()].ctl
                | if self.istatus(ch, now) {
                    CTL_ISTATUS
                } else {
                    0
                }
        };
        let tval = |ch: TimerChannel| {
            // The low 32 bits of CVAL - count, sign-extended.
            let d = self.chan[ch.index()].cval.wrapping_sub(self.count(ch, now));
            d as u32 as i32 as i64 as u64
        };
        match reg {
            CntReg::Frq => self.frequency_hz,
            CntReg::Pct => self.cntpct(now),
            CntReg::Vct => self.cntvct(now),
            CntReg::Voff => self.cntvoff,
            CntReg::VCtl => ctl(TimerChannel::Virtual),
            CntReg::PCtl => ctl(TimerChannel::Physical),
            CntReg::VCval => self.chan[0].cval,
            CntReg::PCval => self.chan[1].cval,
            CntReg::VTval => tval(TimerChannel::Virtual),
            CntReg::PTval => tval(TimerChannel::Physical),
        }
    }

    /// An MSR of a timer register at `now`. CTL takes ENABLE and IMASK
    /// (ISTATUS is read-only and ignored); a TVAL write sets CVAL to the
    /// counter plus the sign-extended 32-bit value; CNTVOFF moves the
    /// virtual timer's deadline.
    pub fn write(&mut self, reg: CntReg, value: u64, now: Time) -> Result<TimerUpdate, TimerError> {
        let (ch, i) = match reg {
            CntReg::Frq | CntReg::Pct | CntReg::Vct => return Err(TimerError::ReadOnly(reg)),
            CntReg::Voff => {
                self.cntvoff = value;
                return Ok(self.update(TimerChannel::Virtual, now));
            }
            CntReg::VCtl | CntReg::VCval | CntReg::VTval => (TimerChannel::Virtual, 0),
            CntReg::PCtl | CntReg::PCval | CntReg::PTval => (TimerChannel::Physical, 1),
        };
        match reg {
            CntReg::VCtl | CntReg::PCtl => {
                if value & !(CTL_ENABLE | CTL_IMASK | CTL_ISTATUS) != 0 {
                    return Err(TimerError::Reserved { reg, value });
                }
                self.chan[i].ctl = value & (CTL_ENABLE | CTL_IMASK);
            }
            CntReg::VCval | CntReg::PCval => self.chan[i].cval = value,
            _ => {
                let delta = value as u32 as i32 as i64;
                self.chan[i].cval = self.count(ch, now).wrapping_add(delta as u64);
            }
        }
        Ok(self.update(ch, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{MS, NS, US};

    /// 100 MHz: one count every 10 ns.
    fn timer() -> GenericTimer {
        GenericTimer::new(&TimerParams {
            frequency_hz: 100_000_000,
        })
    }

    const V: TimerChannel = TimerChannel::Virtual;
    const P: TimerChannel = TimerChannel::Physical;

    #[test]
    fn counters_follow_time_and_frequency() {
        let t = timer();
        assert_eq!(t.cntpct(0), 0);
        assert_eq!(t.cntpct(10 * NS), 1);
        assert_eq!(t.cntpct(15 * NS), 1);
        assert_eq!(t.cntpct(MS), 100_000);
        assert_eq!(t.read(CntReg::Frq, 0), 100_000_000);
        assert_eq!(V.ppi(), 27);
        assert_eq!(P.ppi(), 30);
    }

    /// arm/timer.c: the interrupt fires at CVAL, not before.
    #[test]
    fn fires_at_cval() {
        let mut t = timer();
        let now = US;
        t.write(CntReg::VCval, t.cntvct(now) + 500, now).unwrap();
        let u = t.write(CntReg::VCtl, CTL_ENABLE, now).unwrap();
        assert!(!u.level);
        let (at, gen) = u.arm.unwrap();
        assert_eq!(at, now + 500 * 10 * NS);
        assert!(!t.output(V, at - 1));
        assert_eq!(t.read(CntReg::VCtl, at - 1) & CTL_ISTATUS, 0);
        assert_eq!(t.expired(V, at, gen), Some(true));
        assert_ne!(t.read(CntReg::VCtl, at) & CTL_ISTATUS, 0);
        assert_eq!(t.next_fire(V, at), None, "already firing");
        // Moving CVAL into the future drops the line and re-arms.
        let u = t.write(CntReg::VCval, t.cntvct(at) + 100, at).unwrap();
        assert!(!u.level);
        assert_eq!(u.arm.map(|(a, _)| a), Some(at + US));
        assert_eq!(t.expired(V, at, gen), None, "the old event is stale");
        assert_eq!(t.counters().stale, 1);
    }

    /// arm/timer.c: IMASK masks the interrupt but not ISTATUS; unmasking a
    /// met condition raises the line at once.
    #[test]
    fn imask_masks_the_output() {
        let mut t = timer();
        t.write(CntReg::PCval, 100, 0).unwrap();
        let u = t.write(CntReg::PCtl, CTL_ENABLE | CTL_IMASK, 0).unwrap();
        assert_eq!(u.arm, None, "masked: nothing to schedule");
        let later = 2 * US;
        assert!(t.istatus(P, later));
        assert!(!t.output(P, later));
        let u = t.write(CntReg::PCtl, CTL_ENABLE, later).unwrap();
        assert!(u.level && u.arm.is_none());
        // Disabling clears ISTATUS and the line.
        let u = t.write(CntReg::PCtl, 0, later).unwrap();
        assert!(!u.level);
        assert_eq!(t.read(CntReg::PCtl, later), 0);
    }

    /// arm/timer.c: TVAL is CVAL relative to the counter, a signed 32-bit
    /// value that goes negative once the timer has expired.
    #[test]
    fn tval_semantics() {
        let mut t = timer();
        let now = 10 * US; // count 1000
        t.write(CntReg::PTval, 250, now).unwrap();
        assert_eq!(t.read(CntReg::PCval, now), 1250);
        assert_eq!(t.read(CntReg::PTval, now + US), 150);
        let past = now + 5 * US; // count 1500
        assert_eq!(t.read(CntReg::PTval, past) as i64, -250);
        // A negative TVAL puts CVAL in the past: fires at once when enabled.
        t.write(CntReg::PTval, (-5i64) as u64, past).unwrap();
        assert_eq!(t.read(CntReg::PCval, past), 1495);
        let u = t.write(CntReg::PCtl, CTL_ENABLE, past).unwrap();
        assert!(u.level);
        // Only the low 32 bits of a TVAL write count.
        t.write(CntReg::PTval, (1 << 32) | 7, past).unwrap();
        assert_eq!(t.read(CntReg::PCval, past), 1507);
    }

    /// arm/timer.c: CNTVOFF shifts the virtual counter and the virtual
    /// timer's deadline, not the physical timer.
    #[test]
    fn cntvoff_applies_to_the_virtual_timer_only() {
        let mut t = timer();
        let now = 100 * US; // physical count 10_000
        t.write(CntReg::Voff, 4_000, now).unwrap();
        assert_eq!(t.read(CntReg::Vct, now), 6_000);
        assert_eq!(t.read(CntReg::Pct, now), 10_000);
        t.write(CntReg::VCval, 7_000, now).unwrap();
        t.write(CntReg::PCval, 7_000, now).unwrap();
        t.write(CntReg::PCtl, CTL_ENABLE, now).unwrap();
        assert!(t.output(P, now), "physical count is past 7000 already");
        let u = t.write(CntReg::VCtl, CTL_ENABLE, now).unwrap();
        assert!(!u.level);
        // Virtual count 7000 = physical 11_000 = 110 µs.
        assert_eq!(u.arm.map(|(a, _)| a), Some(110 * US));
        // A smaller offset brings the deadline closer (the vCPU migrated to
        // a host whose counter view differs): a new arm, the old one stale.
        let gen = u.arm.unwrap().1;
        let u = t.write(CntReg::Voff, 3_500, now).unwrap();
        assert_eq!(u.arm.map(|(a, _)| a), Some(105 * US));
        assert_eq!(t.expired(V, 110 * US, gen), None);
    }

    #[test]
    fn bad_writes_are_refused_and_far_deadlines_never_fire() {
        let mut t = timer();
        assert_eq!(
            t.write(CntReg::Pct, 0, 0),
            Err(TimerError::ReadOnly(CntReg::Pct))
        );
        assert_eq!(
            t.write(CntReg::Frq, 1, 0),
            Err(TimerError::ReadOnly(CntReg::Frq))
        );
        assert!(t.write(CntReg::VCtl, 8, 0).is_err());
        t.write(CntReg::VCval, u64::MAX, 0).unwrap();
        let u = t.write(CntReg::VCtl, CTL_ENABLE, 0).unwrap();
        assert_eq!(u.arm, None, "beyond the end of simulated time");
        // CVAL + CNTVOFF overflowing 64 bits never fires either.
        t.write(CntReg::Voff, 10, 0).unwrap();
        assert_eq!(t.next_fire(V, 0), None);
    }
}
