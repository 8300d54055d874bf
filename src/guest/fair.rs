//! Fair sharing of a CPU among tasks of equal priority, CFS-like, for the
//! programs that run many equal server tasks on one vCPU (nginx workers,
//! Apache's threads, memcached's workers under memaslap): without it the
//! kernel runs the first runnable task of the highest priority, and a
//! saturated server's first task never blocks and starves the others.
//!
//! Each task accrues virtual runtime for the CPU time it asks for; the
//! scheduler picks the runnable task of the highest priority with the
//! least; the tick ends a task's slice once it has run
//! `max(sched_latency / nr_running, min_granularity)` and another task of
//! its priority waits; a task waking from a sleep is placed no further
//! back than half a latency period behind the CPU's minimum (sleeper
//! credit), so a long sleep buys no long monopoly. Linux 4.4's defaults
//! for one CPU: 6 ms latency, 0.75 ms minimum granularity. Switched on
//! per kernel ([`Kernel::set_fair_share`]); otherwise scheduling is as
//! before.

use super::{Kernel, TaskState};
use crate::engine::{Time, US};

/// `sysctl_sched_latency` for one CPU.
const SCHED_LATENCY: Time = 6000 * US;
/// `sysctl_sched_min_granularity` for one CPU.
const MIN_GRANULARITY: Time = 750 * US;

/// Per-CPU state of the fair share.
#[derive(Clone, Debug, Default)]
pub(super) struct FairShare {
    /// The CPU's minimum virtual runtime (monotonic).
    min_vruntime: Vec<Time>,
    /// The running task's virtual runtime when it was picked.
    slice_from: Vec<Time>,
}

impl Kernel {
    /// Shares each CPU fairly among its tasks of equal priority.
    pub fn set_fair_share(&mut self) {
        let n = self.cpus.len();
        self.fair = Some(FairShare {
            min_vruntime: vec![0; n],
            slice_from: vec![0; n],
        });
    }

    /// The runnable task of the highest priority with the least virtual
    /// runtime on the current CPU (lowest index on a tie), noted as the
    /// one whose slice starts.
    pub(super) fn fair_pick(&mut self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, t) in self.tasks.iter().enumerate() {
            if t.cpu != self.on || t.state != TaskState::Runnable {
                continue;
            }
            let better = best.is_none_or(|b| {
                let b = &self.tasks[b];
                t.prio > b.prio || (t.prio == b.prio && t.vruntime < b.vruntime)
            });
            if better {
                best = Some(i);
            }
        }
        if let (Some(b), Some(f)) = (best, self.fair.as_mut()) {
            let vr = self.tasks[b].vruntime;
            f.min_vruntime[self.on] = f.min_vruntime[self.on].max(vr);
            f.slice_from[self.on] = vr;
        }
        best
    }

    /// Task `t` asked for `d` of CPU.
    pub(super) fn fair_charge(&mut self, t: usize, d: Time) {
        if self.fair.is_some() {
            self.tasks[t].vruntime += d;
        }
    }

    /// Task `t` wakes from a sleep: sleeper credit of at most half a
    /// latency period.
    pub(super) fn fair_wake(&mut self, t: usize) {
        let Some(f) = &self.fair else { return };
        let floor = f.min_vruntime[self.tasks[t].cpu].saturating_sub(SCHED_LATENCY / 2);
        let task = &mut self.tasks[t];
        task.vruntime = task.vruntime.max(floor);
    }

    /// The tick on the current CPU: end the running task's slice if it
    /// has had its share and another task of its priority waits.
    pub(super) fn fair_tick(&mut self) {
        let Some(f) = &self.fair else { return };
        let Some(cur) = self.cpus[self.on].current else {
            return;
        };
        let prio = self.tasks[cur].prio;
        let waiting = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, t)| {
                *i != cur && t.cpu == self.on && t.state == TaskState::Runnable && t.prio == prio
            })
            .count() as Time;
        if waiting == 0 {
            return;
        }
        let slice = (SCHED_LATENCY / (waiting + 1)).max(MIN_GRANULARITY);
        let ran = self.tasks[cur]
            .vruntime
            .saturating_sub(f.slice_from[self.on]);
        if ran >= slice {
            self.cpus[self.on].need_resched = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::app::{App, Metrics, Sys, TaskStep};

    /// Always has 100 µs of work.
    struct Busy;
    impl App for Busy {
        fn step(&mut self, _: &mut Sys) -> TaskStep {
            TaskStep::Compute(100 * US)
        }
        fn metrics(&self, _: &mut Metrics) {}
    }

    fn config() -> crate::guest::GuestConfig {
        crate::guest::test_config()
    }

    fn kernel(tasks: usize) -> Kernel {
        let mut k = Kernel::new(config());
        for _ in 0..tasks {
            k.spawn(Box::new(Busy), 0, false);
        }
        k
    }

    #[test]
    fn the_least_run_task_of_the_top_priority_is_picked() {
        let mut k = kernel(3);
        k.set_fair_share();
        k.tasks[0].vruntime = 500;
        k.tasks[1].vruntime = 100;
        k.tasks[2].vruntime = 300;
        assert_eq!(k.fair_pick(), Some(1));
        // A higher priority wins whatever its runtime.
        k.tasks[2].prio = 5;
        assert_eq!(k.fair_pick(), Some(2));
    }

    #[test]
    fn a_slice_ends_at_the_tick_only_when_another_task_waits() {
        let mut k = kernel(2);
        k.set_fair_share();
        assert_eq!(k.fair_pick(), Some(0));
        k.cpus[k.on].current = Some(0);
        k.cpus[k.on].need_resched = false;
        // Two tasks: 3 ms slices.
        k.fair_charge(0, 2900 * US);
        k.fair_tick();
        assert!(!k.cpus[k.on].need_resched);
        k.fair_charge(0, 100 * US);
        k.fair_tick();
        assert!(k.cpus[k.on].need_resched);
        // Alone, it runs on.
        k.cpus[k.on].need_resched = false;
        k.tasks[1].state = TaskState::Blocked;
        k.fair_charge(0, 10_000 * US);
        k.fair_tick();
        assert!(!k.cpus[k.on].need_resched);
    }

    #[test]
    fn a_long_sleeper_gets_at_most_half_a_latency_of_credit() {
        let mut k = kernel(2);
        k.set_fair_share();
        k.tasks[0].vruntime = 100_000 * US;
        k.tasks[1].state = TaskState::Blocked;
        assert_eq!(k.fair_pick(), Some(0));
        k.fair_wake(1);
        assert_eq!(k.tasks[1].vruntime, 97_000 * US);
        // Without the fair share nothing changes.
        let mut plain = kernel(1);
        plain.fair_charge(0, US);
        plain.fair_wake(0);
        assert_eq!(plain.tasks[0].vruntime, 0);
    }
}
