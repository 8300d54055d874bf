//! A physical core: what context it runs (host, a guest vCPU, a native
//! kernel, or idle) and its current preemptible work segment.

use crate::engine::Time;

/// What a core is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreMode {
    /// Host idle loop: interrupts are handled at once.
    Idle,
    /// VMX root mode, handling an exit of vCPU `vcpu`.
    Host {
        /// The vCPU whose exit is being handled.
        vcpu: usize,
    },
    /// VMX non-root mode running `vcpu`.
    Guest {
        /// The running vCPU.
        vcpu: usize,
    },
    /// No hypervisor: a native kernel's CPU owns the core (bare metal).
    Native {
        /// That kernel CPU, as a global vCPU index (the world's `kcpu`
        /// maps it to its kernel and CPU).
        kernel: usize,
    },
}

/// A preemptible work segment: started at `start`, due to finish at `end`.
/// Its completion event carries `gen`; preempting bumps `gen`, so the
/// pending completion event becomes stale and is ignored.
#[derive(Clone, Copy, Debug, Default)]
pub struct Segment {
    /// Whether a segment is running.
    pub active: bool,
    /// Start time.
    pub start: Time,
    /// Scheduled end.
    pub end: Time,
    /// Generation of the completion event.
    pub gen: u64,
    /// The work it carries (at the core's full speed alone).
    pub work: Time,
    /// The share of its speed alone the segment runs at (1: the core to
    /// itself; below 1: a busy Hyper-Threading sibling shares it).
    pub speed: f64,
}

/// One physical core.
#[derive(Clone, Debug)]
pub struct Core {
    /// x2APIC id of its LAPIC.
    pub apic_id: u32,
    /// Current mode.
    pub mode: CoreMode,
    /// Current segment.
    pub seg: Segment,
    /// When the current guest-mode stretch began (for time in guest).
    pub guest_since: Time,
    /// Its Hyper-Threading sibling, the other logical CPU of the same
    /// physical core (none: a core of its own).
    pub smt_sibling: Option<usize>,
}

impl Core {
    /// An idle core.
    pub fn new(apic_id: u32) -> Self {
        Core {
            apic_id,
            mode: CoreMode::Idle,
            seg: Segment::default(),
            guest_since: 0,
            smt_sibling: None,
        }
    }

    /// Starts a segment of `len` at `now`; returns (end, gen) for the
    /// completion event.
    pub fn start(&mut self, now: Time, len: Time) -> (Time, u64) {
        self.start_at(now, len, 1.0)
    }

    /// Starts a segment carrying `work` at `speed` (a share of the core's
    /// speed alone, in (0, 1]): it takes work / speed of wall time.
    /// Returns (end, gen) for the completion event.
    pub fn start_at(&mut self, now: Time, work: Time, speed: f64) -> (Time, u64) {
        let wall = if speed >= 1.0 {
            work
        } else {
            (work as f64 / speed).ceil() as Time
        };
        self.seg.gen += 1;
        self.seg.active = true;
        self.seg.start = now;
        self.seg.end = now + wall;
        self.seg.work = work;
        self.seg.speed = speed.min(1.0);
        (self.seg.end, self.seg.gen)
    }

    /// Preempts the running segment; returns the work it did (0 if none):
    /// the time it ran, times its speed.
    pub fn preempt(&mut self, now: Time) -> Time {
        if !self.seg.active {
            return 0;
        }
        self.seg.active = false;
        self.seg.gen += 1;
        let ran = now.saturating_sub(self.seg.start);
        if self.seg.speed >= 1.0 {
            ran
        } else {
            ((ran as f64 * self.seg.speed) as Time).min(self.seg.work)
        }
    }

    /// The completion event `gen` came due: true if it is the live one (the
    /// segment then ends).
    pub fn complete(&mut self, gen: u64) -> bool {
        if self.seg.active && self.seg.gen == gen {
            self.seg.active = false;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemption_makes_completion_stale_and_reports_elapsed() {
        let mut c = Core::new(1);
        let (end, g) = c.start(100, 50);
        assert_eq!(end, 150);
        assert_eq!(c.preempt(120), 20);
        assert!(!c.complete(g), "stale completion must be ignored");
        assert_eq!(c.preempt(130), 0, "nothing running");
        let (_, g2) = c.start(130, 30);
        assert_ne!(g, g2);
        assert!(c.complete(g2));
        assert!(!c.complete(g2), "completes once");
    }

    #[test]
    fn a_shared_core_stretches_the_segment_and_preemption_counts_work_done() {
        let mut c = Core::new(1);
        let (end, g) = c.start_at(100, 65, 0.65);
        assert_eq!(end, 200, "65 of work at 0.65 takes 100");
        assert_eq!(c.seg.work, 65);
        assert_eq!(c.preempt(150), 32, "50 of wall time at 0.65 is 32 of work");
        assert!(!c.complete(g));
        // Alone, wall time is work.
        let (end, _) = c.start_at(200, 65, 1.0);
        assert_eq!(end, 265);
        assert_eq!(c.preempt(230), 30);
    }
}
