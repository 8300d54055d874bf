//! cyclictest (DID §5.4): a highest-priority thread that sleeps to absolute
//! deadlines one interval apart and measures how late it wakes, from timer
//! expiry to the user-level code running.

use crate::engine::{as_us, LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Start,
    Woken,
    Measure,
    Sleep,
}

/// The measuring thread.
pub struct Cyclictest {
    interval: Time,
    phase: Time,
    user_cost: Time,
    loop_cost: Time,
    signal_cost: Time,
    next: Time,
    stage: Stage,
    hist: LatencyHistogram,
}

impl Cyclictest {
    /// One thread, `interval` apart; `user_cost` = return to user and
    /// clock_gettime; `loop_cost` = bookkeeping before the next sleep.
    /// `phase`: the first deadline is one interval plus `phase` after start
    /// (cyclictest starts at an arbitrary moment relative to the kernel's
    /// tick, and keeps that phase for the whole run).
    pub fn new(interval: Time, phase: Time, user_cost: Time, loop_cost: Time) -> Self {
        Cyclictest {
            interval,
            phase,
            user_cost,
            loop_cost,
            signal_cost: 0,
            next: 0,
            stage: Stage::Start,
            hist: LatencyHistogram::new(),
        }
    }
}

impl Cyclictest {
    /// rt-tests' POSIX-timer mode (no `-n`): each wake-up also costs the
    /// signal's queueing in the timer interrupt and its dequeue with the
    /// timer's re-arm in the woken thread, both before cyclictest reads
    /// the clock. Both are charged on the thread's path: the interrupt's
    /// share runs before the thread does either way, and the re-armed
    /// expiry (one interval on) is never the CPU's earliest timer then,
    /// so it programs no clockevent (docs/papers.md, DID cyclictest under
    /// KVM 3.6).
    pub fn with_posix_timer(mut self, signal_cost: Time) -> Self {
        self.signal_cost = signal_cost;
        self
    }
}

impl App for Cyclictest {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        match self.stage {
            Stage::Start => {
                self.next = sys.now + self.interval + self.phase;
                self.stage = Stage::Woken;
                TaskStep::SleepUntil(self.next)
            }
            Stage::Woken => {
                self.stage = Stage::Measure;
                TaskStep::Compute(self.user_cost + self.signal_cost)
            }
            Stage::Measure => {
                self.hist.record(sys.now.saturating_sub(self.next));
                self.next += self.interval;
                self.stage = Stage::Sleep;
                TaskStep::Compute(self.loop_cost)
            }
            Stage::Sleep => {
                self.stage = Stage::Woken;
                TaskStep::SleepUntil(self.next)
            }
        }
    }

    fn reset_metrics(&mut self) {
        self.hist = LatencyHistogram::new();
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(
            LatencyFamily::us("cyclictest.latency", &self.hist)
                .with_mean_us("cyclictest.latency_mean_us"),
        );
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("cyclictest.latency_mean_us".into(), self.hist.mean_us());
        // The percentile curve (p50 .. p99.9), for latency plots.
        insert_percentiles_us(out, "cyclictest.latency", &self.hist);
        out.insert("cyclictest.latency_max_us".into(), as_us(self.hist.max()));
        out.insert("cyclictest.samples".into(), self.hist.count() as f64);
    }
}

/// rt-tests' main thread with `-q`: `while (!shutdown) { ... usleep(10000); }`
/// (`main` in `src/cyclictest/cyclictest.c`): each pass returns from the
/// sleep, checks the threads' cycle counts and sleeps again. Its sleep is
/// relative and, as a normal task's, carries the default timer slack: the
/// kernel programs the clockevent for the end of the slack
/// (`hrtimer_start_range_ns`, `current->timer_slack_ns`).
pub struct CyclictestMain {
    period: Time,
    slack: Time,
    loop_cost: Time,
    woken: bool,
}

/// `usleep(10000)` in cyclictest's main loop.
pub const MAIN_PERIOD_US: u64 = 10_000;
/// Linux's default timer slack for a normal task, 50 µs
/// (`init_task.timer_slack_ns`, include/linux/init_task.h, 2.6.28 on).
pub const TIMER_SLACK_NS: u64 = 50_000;

impl CyclictestMain {
    /// `period`: the sleep; `slack`: its timer slack; `loop_cost`: one
    /// pass (system call return and entry, the loop's checks).
    pub fn new(period: Time, slack: Time, loop_cost: Time) -> Self {
        CyclictestMain {
            period,
            slack,
            loop_cost,
            woken: false,
        }
    }
}

impl App for CyclictestMain {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        if self.woken {
            self.woken = false;
            TaskStep::SleepUntil(sys.now + self.period + self.slack)
        } else {
            self.woken = true;
            TaskStep::Compute(self.loop_cost)
        }
    }

    /// With `-q` it reports only at the end: the measuring thread's
    /// metrics are the test's.
    fn metrics(&self, _out: &mut Metrics) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::US;
    use std::collections::VecDeque;

    #[test]
    fn measures_lateness_against_absolute_deadlines() {
        let mut c = Cyclictest::new(1000 * US, 0, 200_000, 100_000);
        let mut q: VecDeque<crate::guest::app::Datagram> = VecDeque::new();
        let mut sys = Sys {
            now: 0,
            socket: Some(&mut q),
            tcp: None,
            conns: None,
            blk: None,
            udp_tx: None,
            shared: None,
            vsock: None,
        };
        assert_eq!(c.step(&mut sys), TaskStep::SleepUntil(1000 * US));
        sys.now = 1000 * US + 1_500_000; // woken 1.5 µs late
        assert_eq!(c.step(&mut sys), TaskStep::Compute(200_000));
        sys.now += 200_000;
        assert_eq!(c.step(&mut sys), TaskStep::Compute(100_000));
        assert_eq!(c.hist.mean(), 1_700_000);
        assert_eq!(c.step(&mut sys), TaskStep::SleepUntil(2000 * US));
    }

    #[test]
    fn the_main_thread_sleeps_relative_with_its_slack() {
        let mut m = CyclictestMain::new(10_000 * US, 50 * US, 350_000);
        let mut q: VecDeque<crate::guest::app::Datagram> = VecDeque::new();
        let mut sys = Sys {
            now: 0,
            socket: Some(&mut q),
            tcp: None,
            conns: None,
            blk: None,
            udp_tx: None,
            shared: None,
            vsock: None,
        };
        assert_eq!(m.step(&mut sys), TaskStep::Compute(350_000));
        sys.now = 1_000_000;
        assert_eq!(
            m.step(&mut sys),
            TaskStep::SleepUntil(1_000_000 + 10_050 * US)
        );
        sys.now = 20_000 * US;
        assert_eq!(m.step(&mut sys), TaskStep::Compute(350_000));
    }

    /// Without `-n` the signal's delivery and the timer's re-arm lie
    /// between the expiry and the clock read: they count as latency.
    #[test]
    fn posix_timer_mode_measures_the_signal_path_as_latency() {
        let mut c = Cyclictest::new(1000 * US, 0, 200_000, 100_000).with_posix_timer(500_000);
        let mut q: VecDeque<crate::guest::app::Datagram> = VecDeque::new();
        let mut sys = Sys {
            now: 0,
            socket: Some(&mut q),
            tcp: None,
            conns: None,
            blk: None,
            udp_tx: None,
            shared: None,
            vsock: None,
        };
        assert_eq!(c.step(&mut sys), TaskStep::SleepUntil(1000 * US));
        sys.now = 1000 * US + 1_500_000;
        assert_eq!(c.step(&mut sys), TaskStep::Compute(700_000));
        sys.now += 700_000;
        c.step(&mut sys);
        assert_eq!(c.hist.mean(), 2_200_000);
    }
}
