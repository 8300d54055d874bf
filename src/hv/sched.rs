//! The host scheduler: a CFS-like per-core scheduler of host threads —
//! vCPU threads, vhost / I/O threads, background burners — as Linux 4.4's
//! `kernel/sched/fair.c` does it, reduced to what decides *who runs on a
//! core and when*: weights, virtual runtime, the scheduling period and
//! slice, sleeper placement, wake-up preemption, tick preemption, wake-up
//! core selection and new-idle pulling.
//!
//! The scheduler is pure policy over simulated time: the world asks it
//! what to run and tells it when threads block, wake and run; the switch
//! itself (and the scheme's vcpu_put / vcpu_load hooks) is the world's.
//! Run queues are short vectors scanned for the leftmost entity, so no
//! operation allocates once the threads exist.
//!
//! Tunables follow Linux 4.4 (`SCHED_TUNABLESCALING_LOG`): the 6 ms
//! latency, 0.75 ms minimum granularity and 1 ms wake-up granularity are
//! scaled by 1 + log2(min(cpus, 8)).

use crate::engine::{CpuMask, Time, MS, US};

/// A host thread's id.
pub type Tid = usize;

/// Load weight of nice 0 (`NICE_0_LOAD`).
pub const NICE_0_WEIGHT: u64 = 1024;

/// The load weight of a nice level: each step is worth ~10% of CPU, i.e.
/// 1024 / 1.25^nice (the kernel's `sched_prio_to_weight` table agrees
/// within 1%).
pub fn weight_of_nice(nice: i32) -> u64 {
    let n = nice.clamp(-20, 19);
    ((NICE_0_WEIGHT as f64) / 1.25f64.powi(n)).round().max(1.0) as u64
}

/// CFS tunables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfsParams {
    /// `sysctl_sched_latency`: the period every runnable thread runs once in.
    pub latency: Time,
    /// `sysctl_sched_min_granularity`: the shortest slice.
    pub min_granularity: Time,
    /// `sysctl_sched_wakeup_granularity`: how far ahead (in virtual time) a
    /// running thread must be before a waking one preempts it.
    pub wakeup_granularity: Time,
}

impl CfsParams {
    /// Linux 4.4's defaults on a machine with `cpus` CPUs.
    pub fn linux44(cpus: usize) -> Self {
        let factor = 1 + (cpus.clamp(1, 8) as u64).ilog2() as u64;
        CfsParams {
            latency: 6 * MS * factor,
            min_granularity: 750 * US * factor,
            wakeup_granularity: MS * factor,
        }
    }

    /// `sched_nr_latency`: above this many runnable threads the period
    /// stretches to nr × min_granularity.
    pub fn nr_latency(&self) -> u64 {
        (self.latency / self.min_granularity.max(1)).max(1)
    }

    /// `__sched_period`.
    pub fn period(&self, nr_running: u64) -> Time {
        if nr_running > self.nr_latency() {
            nr_running * self.min_granularity
        } else {
            self.latency
        }
    }
}

/// One schedulable host thread.
#[derive(Clone, Debug)]
pub struct Thread {
    /// Load weight (from its nice level).
    pub weight: u64,
    /// Cores it may run on (bit i = core i); pinning.
    pub allowed: CpuMask,
    /// Virtual runtime, ps of nice-0 CPU time.
    pub vruntime: u64,
    /// The core whose run queue holds it (or held it last).
    pub core: usize,
    /// Runnable (queued or running) rather than sleeping.
    pub runnable: bool,
    /// When it last started running.
    exec_start: Time,
    /// Its total run time.
    pub sum_exec: Time,
    /// `sum_exec` when it was last picked (for the slice check).
    prev_sum_exec: Time,
    /// When it became runnable and not running, if it is waiting.
    wait_start: Option<Time>,
    /// Time spent runnable but not running (in the run queue).
    pub wait_time: Time,
    /// Times it was switched in.
    pub switches_in: u64,
    /// Times it was preempted while still runnable.
    pub preemptions: u64,
    /// Times it moved to another core (wake-up placement or balancing).
    pub migrations: u64,
    /// The group it belongs to (a VM, for its vCPU threads), for vCPU
    /// stacking: siblings runnable on one core.
    pub group: Option<usize>,
}

/// vCPU stacking of one group (a VM): how long two or more of its threads
/// were runnable on one core (one waits behind its sibling, or both behind
/// others), as `perf sched` would show it.
#[derive(Clone, Debug, Default)]
struct Stacking {
    /// Per core: the group's runnable threads there.
    on_core: Vec<u16>,
    /// Cores holding two or more of them.
    stacked_cores: usize,
    /// When `stacked_cores` last became non-zero.
    since: Time,
    /// Total stacked time, up to `since` while stacked.
    total: Time,
}

/// Why a core must reschedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The woken thread was queued on `core`, which was idle: run it.
    RunIdle {
        /// Core.
        core: usize,
    },
    /// The woken thread preempts the current one on `core`.
    Preempt {
        /// Core.
        core: usize,
    },
    /// Queued on `core` behind the current thread.
    Queued {
        /// Core.
        core: usize,
    },
}

/// Per-core run queue.
#[derive(Clone, Debug, Default)]
struct RunQueue {
    /// Runnable threads not running.
    queued: Vec<Tid>,
    /// The running thread.
    curr: Option<Tid>,
    /// Monotonic floor of the queue's virtual time.
    min_vruntime: u64,
    /// Sum of the weights of queued threads and the current one.
    load: u64,
}

/// The host scheduler of a machine.
#[derive(Clone, Debug)]
pub struct HostScheduler {
    /// Tunables.
    pub params: CfsParams,
    threads: Vec<Thread>,
    rqs: Vec<RunQueue>,
    /// Per group: its stacking.
    groups: Vec<Stacking>,
    /// Per core: when its next periodic balance is due.
    next_balance: Vec<Time>,
    /// Some thread may run on more than one core. Without one, no thread
    /// queued elsewhere may ever run on a given core: pulling and
    /// balancing have nothing to look for, whatever the number of cores.
    floating: bool,
}

/// `sysctl_sched_migration_cost`: a thread that ran this recently is
/// cache-hot and not moved by periodic balancing (`task_hot`).
pub const MIGRATION_COST: Time = 500 * US;

/// `imbalance_pct` of the MC (shared-LLC) scheduling domain in Linux 4.4's
/// `sd_init`: the busiest core must hold 17% more load than this one.
const IMBALANCE_PCT: u64 = 117;

/// `busy_factor` of Linux 4.4's `sd_init`: a busy core balances 32 times
/// less often than an idle one.
const BUSY_FACTOR: u64 = 32;

fn calc_delta_fair(delta: Time, weight: u64) -> u64 {
    ((delta as u128 * NICE_0_WEIGHT as u128) / weight.max(1) as u128) as u64
}

impl HostScheduler {
    /// A scheduler for `cores` cores with Linux 4.4's tunables.
    pub fn new(cores: usize) -> Self {
        HostScheduler {
            params: CfsParams::linux44(cores),
            threads: Vec::new(),
            rqs: vec![RunQueue::default(); cores],
            groups: Vec::new(),
            next_balance: vec![0; cores],
            floating: false,
        }
    }

    /// Puts sleeping thread `t` in group `g` (its VM) for the stacking
    /// measure.
    pub fn set_group(&mut self, t: Tid, g: usize) {
        debug_assert!(!self.threads[t].runnable);
        if self.groups.len() <= g {
            let cores = self.rqs.len();
            self.groups.resize_with(g + 1, || Stacking {
                on_core: vec![0; cores],
                ..Stacking::default()
            });
        }
        self.threads[t].group = Some(g);
    }

    /// Time group `g` has had two or more threads runnable on one core, up
    /// to `now`.
    pub fn stacked_time(&self, g: usize, now: Time) -> Time {
        self.groups.get(g).map_or(0, |s| {
            s.total
                + if s.stacked_cores > 0 {
                    now.saturating_sub(s.since)
                } else {
                    0
                }
        })
    }

    /// Thread `t` became runnable on `core` (`add`) or stopped being so.
    fn note_runnable(&mut self, t: Tid, core: usize, add: bool, now: Time) {
        let Some(g) = self.threads[t].group else {
            return;
        };
        let s = &mut self.groups[g];
        let n = &mut s.on_core[core];
        let before = s.stacked_cores;
        if add {
            *n += 1;
            if *n == 2 {
                s.stacked_cores += 1;
            }
        } else {
            if *n == 2 {
                s.stacked_cores -= 1;
            }
            *n = n.saturating_sub(1);
        }
        match (before, s.stacked_cores) {
            (0, x) if x > 0 => s.since = now,
            (b, 0) if b > 0 => s.total += now.saturating_sub(s.since),
            _ => {}
        }
    }

    /// Adds a sleeping thread of `nice` that may run on the cores in
    /// `allowed` (bit i = core i; 0 means all), last run on `home`.
    pub fn add_thread(&mut self, nice: i32, allowed: CpuMask, home: usize) -> Tid {
        let all = CpuMask::first_n(self.rqs.len());
        let allowed = if allowed.is_empty() {
            all
        } else {
            allowed.intersection(all)
        };
        let home = if allowed.contains(home) {
            home
        } else {
            allowed.first().unwrap_or(0)
        };
        self.floating |= allowed.count() > 1;
        for rq in &mut self.rqs {
            rq.queued.reserve(1);
        }
        self.threads.push(Thread {
            weight: weight_of_nice(nice),
            allowed,
            vruntime: self.rqs[home].min_vruntime,
            core: home,
            runnable: false,
            exec_start: 0,
            sum_exec: 0,
            prev_sum_exec: 0,
            wait_start: None,
            wait_time: 0,
            switches_in: 0,
            preemptions: 0,
            migrations: 0,
            group: None,
        });
        self.threads.len() - 1
    }

    /// Sets sleeping thread `t`'s virtual runtime before it first runs:
    /// threads started at different times (VMs booted one after another)
    /// do not begin level.
    pub fn set_vruntime(&mut self, t: Tid, vruntime: u64) {
        debug_assert!(!self.threads[t].runnable);
        self.threads[t].vruntime = vruntime;
    }

    /// A thread's state.
    pub fn thread(&self, t: Tid) -> &Thread {
        &self.threads[t]
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Time `t` has waited in run queues up to `now`, including a wait
    /// still in progress.
    pub fn waited(&self, t: Tid, now: Time) -> Time {
        let th = &self.threads[t];
        th.wait_time + th.wait_start.map_or(0, |w| now.saturating_sub(w))
    }

    /// The thread running on `core`.
    pub fn current(&self, core: usize) -> Option<Tid> {
        self.rqs[core].curr
    }

    /// Runnable threads on `core` (queued plus running).
    pub fn nr_running(&self, core: usize) -> usize {
        let rq = &self.rqs[core];
        rq.queued.len() + rq.curr.is_some() as usize
    }

    /// Threads waiting in `core`'s run queue.
    pub fn queued(&self, core: usize) -> &[Tid] {
        &self.rqs[core].queued
    }

    /// `update_curr`: charges the running thread of `core` up to `now`.
    pub fn update_curr(&mut self, core: usize, now: Time) {
        let Some(c) = self.rqs[core].curr else { return };
        let t = &mut self.threads[c];
        let delta = now.saturating_sub(t.exec_start);
        t.exec_start = now;
        t.sum_exec += delta;
        t.vruntime += calc_delta_fair(delta, t.weight);
        self.update_min_vruntime(core);
    }

    fn leftmost(&self, core: usize) -> Option<(usize, Tid)> {
        self.rqs[core]
            .queued
            .iter()
            .enumerate()
            .min_by_key(|(_, &t)| (self.threads[t].vruntime, t))
            .map(|(i, &t)| (i, t))
    }

    fn update_min_vruntime(&mut self, core: usize) {
        let curr = self.rqs[core].curr.map(|c| self.threads[c].vruntime);
        let left = self.leftmost(core).map(|(_, t)| self.threads[t].vruntime);
        let v = match (curr, left) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return,
        };
        let rq = &mut self.rqs[core];
        rq.min_vruntime = rq.min_vruntime.max(v);
    }

    /// `sched_slice`: the wall-clock share of the period `t` is due.
    pub fn slice(&self, core: usize, t: Tid) -> Time {
        let rq = &self.rqs[core];
        let th = &self.threads[t];
        let on_rq = rq.curr == Some(t) || rq.queued.contains(&t);
        let nr = (rq.queued.len() + rq.curr.is_some() as usize + !on_rq as usize) as u64;
        let load = rq.load + if on_rq { 0 } else { th.weight };
        (self.params.period(nr) as u128 * th.weight as u128 / load.max(1) as u128) as Time
    }

    /// `select_task_rq` for a wake-up, reduced: the thread's previous core
    /// if it is idle, else the lowest idle core it may use, else the
    /// previous core if allowed, else the allowed core with the fewest
    /// runnable threads.
    fn select_core(&self, t: Tid) -> usize {
        let th = &self.threads[t];
        let ok = |c: usize| th.allowed.contains(c);
        let idle = |c: usize| self.nr_running(c) == 0;
        if ok(th.core) && idle(th.core) {
            return th.core;
        }
        // The allowed cores only (add_thread keeps them below the core
        // count), in increasing order: a pinned thread looks at one core,
        // not at every core of the machine.
        if let Some(c) = th.allowed.iter().find(|&c| idle(c)) {
            return c;
        }
        if ok(th.core) {
            return th.core;
        }
        th.allowed
            .iter()
            .min_by_key(|&c| (self.nr_running(c), c))
            .unwrap_or(th.core)
    }

    fn move_to(&mut self, t: Tid, core: usize) {
        let from = self.threads[t].core;
        if from != core {
            // Migration keeps the thread's lag relative to the queue floor.
            let th = &mut self.threads[t];
            th.vruntime = th
                .vruntime
                .saturating_sub(self.rqs[from].min_vruntime)
                .saturating_add(self.rqs[core].min_vruntime);
            th.core = core;
            th.migrations += 1;
        }
    }

    fn enqueue(&mut self, t: Tid, core: usize, now: Time) {
        let th = &mut self.threads[t];
        th.runnable = true;
        th.wait_start = Some(now);
        let w = th.weight;
        let rq = &mut self.rqs[core];
        rq.queued.push(t);
        rq.load += w;
    }

    /// Wakes sleeping thread `t` at `now` (a vCPU's HLT ends, a vhost
    /// worker is kicked): places it on a core and says whether that core
    /// must reschedule. Waking a runnable thread does nothing (`None`).
    pub fn wake(&mut self, t: Tid, now: Time) -> Option<Wake> {
        if self.threads[t].runnable {
            return None;
        }
        let core = self.select_core(t);
        self.update_curr(core, now);
        self.move_to(t, core);
        // place_entity for a wake-up (GENTLE_FAIR_SLEEPERS): a sleeper is
        // credited at most half a latency period.
        let floor = self.rqs[core]
            .min_vruntime
            .saturating_sub(self.params.latency / 2);
        let th = &mut self.threads[t];
        th.vruntime = th.vruntime.max(floor);
        self.enqueue(t, core, now);
        self.note_runnable(t, core, true, now);
        Some(match self.rqs[core].curr {
            None => Wake::RunIdle { core },
            Some(c) if self.wakeup_preempts(c, t) => Wake::Preempt { core },
            Some(_) => Wake::Queued { core },
        })
    }

    /// `wakeup_preempt_entity`: the woken thread is behind the current one
    /// by more than the wake-up granularity (in the woken thread's
    /// virtual time).
    fn wakeup_preempts(&self, curr: Tid, woken: Tid) -> bool {
        let c = self.threads[curr].vruntime;
        let w = self.threads[woken].vruntime;
        if c <= w {
            return false;
        }
        let gran = calc_delta_fair(self.params.wakeup_granularity, self.threads[woken].weight);
        c - w > gran
    }

    /// The running thread of `core` blocks at `now` (HLT, waiting for
    /// work): it leaves the run queue. The core must pick next.
    pub fn block(&mut self, core: usize, now: Time) -> Option<Tid> {
        self.update_curr(core, now);
        let c = self.rqs[core].curr.take()?;
        let th = &mut self.threads[c];
        th.runnable = false;
        self.rqs[core].load -= th.weight;
        self.note_runnable(c, core, false, now);
        Some(c)
    }

    /// Waiting thread `t` goes to sleep without running again: a vCPU that
    /// was switched away from while it finished the HLT exit that now puts
    /// its thread to sleep (`dequeue_entity` of a queued entity). Returns
    /// whether it was waiting.
    pub fn dequeue(&mut self, t: Tid, now: Time) -> bool {
        let core = self.threads[t].core;
        let Some(i) = self.rqs[core].queued.iter().position(|&q| q == t) else {
            return false;
        };
        self.rqs[core].queued.swap_remove(i);
        let th = &mut self.threads[t];
        th.runnable = false;
        if let Some(ws) = th.wait_start.take() {
            th.wait_time += now.saturating_sub(ws);
        }
        self.rqs[core].load -= th.weight;
        self.note_runnable(t, core, false, now);
        self.update_min_vruntime(core);
        true
    }

    /// `check_preempt_tick`: at a scheduler tick on `core`, whether the
    /// running thread has had its slice (or is a slice ahead of the
    /// leftmost waiting thread, after at least the minimum granularity).
    pub fn tick(&mut self, core: usize, now: Time) -> bool {
        self.update_curr(core, now);
        let Some(c) = self.rqs[core].curr else {
            return false;
        };
        if self.rqs[core].queued.is_empty() {
            return false;
        }
        let ideal = self.slice(core, c);
        let th = &self.threads[c];
        let ran = th.sum_exec - th.prev_sum_exec;
        if ran > ideal {
            return true;
        }
        if ran < self.params.min_granularity {
            return false;
        }
        match self.leftmost(core) {
            Some((_, l)) => {
                let lv = self.threads[l].vruntime;
                th.vruntime > lv && th.vruntime - lv > ideal
            }
            None => false,
        }
    }

    /// The time from `now` at which the running thread of `core` will
    /// have used its slice, if others wait (when the world should check
    /// again without a tick).
    pub fn slice_end(&self, core: usize, now: Time) -> Option<Time> {
        let c = self.rqs[core].curr?;
        if self.rqs[core].queued.is_empty() {
            return None;
        }
        let th = &self.threads[c];
        let ran = th.sum_exec - th.prev_sum_exec + now.saturating_sub(th.exec_start);
        Some(now + self.slice(core, c).saturating_sub(ran))
    }

    /// `pick_next_task_fair` at `now`: puts the running thread back (if it
    /// is still runnable) and switches to the leftmost one; an empty queue
    /// first pulls the longest-waiting thread another core holds but does
    /// not run (new-idle balance). Returns (previous, next).
    pub fn pick_next(&mut self, core: usize, now: Time) -> (Option<Tid>, Option<Tid>) {
        self.update_curr(core, now);
        let prev = self.rqs[core].curr.take();
        if let Some(p) = prev {
            // put_prev_entity: still runnable, back in the queue.
            let w = self.threads[p].weight;
            self.rqs[core].load -= w;
            self.threads[p].preemptions += 1;
            self.enqueue(p, core, now);
        }
        if self.rqs[core].queued.is_empty() {
            self.pull(core, now);
        }
        let next = self.leftmost(core).map(|(i, t)| {
            self.rqs[core].queued.swap_remove(i);
            t
        });
        if let Some(n) = next {
            let th = &mut self.threads[n];
            if let Some(ws) = th.wait_start.take() {
                th.wait_time += now.saturating_sub(ws);
            }
            th.exec_start = now;
            th.prev_sum_exec = th.sum_exec;
            th.switches_in += 1;
            if prev == Some(n) {
                // Picked again: not a preemption after all.
                th.preemptions -= 1;
                th.switches_in -= 1;
            }
            self.rqs[core].curr = Some(n);
        }
        self.update_min_vruntime(core);
        (prev, next)
    }

    /// `sched_yield` by the running thread of `core`: `yield_task_fair`
    /// marks it the skip buddy, and `pick_next_entity` passes over it for
    /// the leftmost waiting thread if that one is not ahead of it by more
    /// than the wake-up granularity (`wakeup_preempt_entity` < 1), or
    /// anyway if the waiting one is behind it. The yielder waits, still
    /// runnable, with its virtual runtime unchanged. Returns (previous,
    /// next) as [`Self::pick_next`], or None when it runs on (nothing
    /// else waits, or what waits is too far ahead).
    pub fn yield_curr(&mut self, core: usize, now: Time) -> Option<(Option<Tid>, Option<Tid>)> {
        let prev = self.rqs[core].curr?;
        let (i, next) = self.leftmost(core)?;
        self.update_curr(core, now);
        let (v_prev, v_next) = (self.threads[prev].vruntime, self.threads[next].vruntime);
        let gran = calc_delta_fair(self.params.wakeup_granularity, self.threads[next].weight);
        if v_next > v_prev && v_next - v_prev > gran {
            return None;
        }
        self.rqs[core].queued.swap_remove(i);
        self.rqs[core].curr = None;
        let w = self.threads[prev].weight;
        self.rqs[core].load -= w;
        self.threads[prev].preemptions += 1;
        self.enqueue(prev, core, now);
        let th = &mut self.threads[next];
        if let Some(ws) = th.wait_start.take() {
            th.wait_time += now.saturating_sub(ws);
        }
        th.exec_start = now;
        th.prev_sum_exec = th.sum_exec;
        th.switches_in += 1;
        self.rqs[core].curr = Some(next);
        self.update_min_vruntime(core);
        Some((Some(prev), Some(next)))
    }

    /// New-idle balance: move the longest-waiting thread that may run on
    /// `core` from another core's queue.
    fn pull(&mut self, core: usize, now: Time) {
        if !self.floating {
            return;
        }
        let mut best: Option<(Time, usize, usize)> = None;
        for (from, rq) in self.rqs.iter().enumerate() {
            if from == core {
                continue;
            }
            for (i, &t) in rq.queued.iter().enumerate() {
                let th = &self.threads[t];
                if !th.allowed.contains(core) {
                    continue;
                }
                let waited = now.saturating_sub(th.wait_start.unwrap_or(now));
                if best.is_none_or(|(w, _, _)| waited > w) {
                    best = Some((waited, from, i));
                }
            }
        }
        if let Some((_, from, i)) = best {
            self.migrate_queued(from, i, core, now);
        }
    }

    /// Moves the `i`th waiting thread of `from`'s queue to `to`'s
    /// (`detach_task` + `attach_task`).
    fn migrate_queued(&mut self, from: usize, i: usize, to: usize, now: Time) {
        let t = self.rqs[from].queued.swap_remove(i);
        let w = self.threads[t].weight;
        self.rqs[from].load -= w;
        self.note_runnable(t, from, false, now);
        self.move_to(t, to);
        let rq = &mut self.rqs[to];
        rq.queued.push(t);
        rq.load += w;
        self.note_runnable(t, to, true, now);
    }

    /// Periodic load balancing (`rebalance_domains` → `load_balance`) on
    /// `core` at a scheduler tick, reduced to one domain spanning every
    /// core: due every `cores` ms (the domain's `min_interval`), 32 times
    /// less often when the core is busy (`busy_factor`). If the busiest
    /// core holds more than 117% of this core's load, waiting threads that
    /// may run here, are not cache-hot (ran within [`MIGRATION_COST`]) and
    /// fit the imbalance are pulled (`detach_tasks`), until the imbalance
    /// (the lesser of the busiest core's excess and this core's deficit
    /// against the average over the cores those threads may use) is used
    /// up. Load is the weight of runnable threads now, not Linux's decayed
    /// average (PELT). Returns whether a
    /// thread was pulled: an idle core must then pick.
    pub fn balance(&mut self, core: usize, now: Time) -> bool {
        if now < self.next_balance[core] {
            return false;
        }
        let ncores = self.rqs.len() as u64;
        let busy = self.rqs[core].curr.is_some();
        let interval = ncores.max(1) * MS * if busy { BUSY_FACTOR } else { 1 };
        self.next_balance[core] = now + interval;
        if !self.floating {
            return false;
        }
        let this = self.rqs[core].load;
        let may_run_here = |s: &Self, t: Tid| s.threads[t].allowed.contains(core);
        let Some(busiest) = (0..self.rqs.len())
            .filter(|&c| c != core)
            .filter(|&c| self.rqs[c].queued.iter().any(|&t| may_run_here(self, t)))
            .max_by_key(|&c| (self.rqs[c].load, std::cmp::Reverse(c)))
        else {
            return false;
        };
        // The average over the cores the movable threads may use: cores
        // they can never reach do not dilute it (what Linux's group
        // imbalance flag achieves for pinned tasks).
        let span = self.rqs[busiest]
            .queued
            .iter()
            .filter(|&&t| may_run_here(self, t))
            .fold(CpuMask::EMPTY, |m, &t| m.union(self.threads[t].allowed));
        let (total, n) = span
            .iter()
            .fold((0u64, 0u64), |(l, n), c| (l + self.rqs[c].load, n + 1));
        let avg = total / n.max(1);
        let load = self.rqs[busiest].load;
        if load * 100 <= IMBALANCE_PCT * this || load <= avg || this >= avg {
            return false;
        }
        let mut imbalance = (load - avg).min(avg - this);
        let mut pulled = false;
        let mut i = 0;
        while i < self.rqs[busiest].queued.len() && imbalance > 0 {
            let t = self.rqs[busiest].queued[i];
            let th = &self.threads[t];
            let hot = now.saturating_sub(th.exec_start) < MIGRATION_COST && th.sum_exec > 0;
            if !may_run_here(self, t) || hot || th.weight / 2 > imbalance {
                i += 1;
                continue;
            }
            imbalance = imbalance.saturating_sub(th.weight);
            // swap_remove puts the last thread at `i`: look at it next.
            self.migrate_queued(busiest, i, core, now);
            pulled = true;
        }
        pulled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tunables_scale_with_log2_of_cpus_as_linux_4_4() {
        let p1 = CfsParams::linux44(1);
        assert_eq!(p1.latency, 6 * MS);
        assert_eq!(p1.min_granularity, 750 * US);
        assert_eq!(p1.nr_latency(), 8);
        let p4 = CfsParams::linux44(4);
        assert_eq!(p4.latency, 18 * MS);
        assert_eq!(p4.wakeup_granularity, 3 * MS);
        // Capped at 8 CPUs: factor 4.
        assert_eq!(CfsParams::linux44(64).latency, 24 * MS);
        assert_eq!(p1.period(4), 6 * MS);
        assert_eq!(p1.period(10), 10 * 750 * US);
    }

    /// `sched_yield` hands the core to a waiting thread and leaves the
    /// yielder runnable, first in line for nothing: alone, it runs on.
    #[test]
    fn a_yield_switches_to_a_waiting_thread_only() {
        let mut s = HostScheduler::new(1);
        let a = s.add_thread(0, CpuMask::from_bits(1), 0);
        let b = s.add_thread(0, CpuMask::from_bits(1), 0);
        s.wake(a, 0);
        s.pick_next(0, 0);
        assert_eq!(s.yield_curr(0, US), None, "nothing waits: no switch");
        assert_eq!(s.current(0), Some(a));
        s.wake(b, 2 * US);
        // b is level with a: the yield switches to it.
        assert_eq!(s.yield_curr(0, 3 * US), Some((Some(a), Some(b))));
        assert_eq!(s.current(0), Some(b));
        assert!(s.thread(a).runnable);
        assert_eq!(s.nr_running(0), 2);
        // b runs a whole latency period: a's yield no longer gives it the
        // core (b is ahead by more than the wake-up granularity).
        let t = 3 * US + s.params.latency;
        s.update_curr(0, t);
        assert_eq!(s.pick_next(0, t), (Some(b), Some(a)));
        assert_eq!(s.yield_curr(0, t + US), None);
        assert_eq!(s.current(0), Some(a));
    }

    #[test]
    fn nice_weights_follow_the_ten_percent_rule() {
        assert_eq!(weight_of_nice(0), 1024);
        // The kernel's table: nice 5 = 335, nice -5 = 3121, nice 19 = 15.
        for (nice, kernel) in [(5, 335u64), (-5, 3121), (19, 15), (-20, 88761)] {
            let w = weight_of_nice(nice) as f64;
            assert!((w / kernel as f64 - 1.0).abs() < 0.03, "nice {nice}: {w}");
        }
    }

    /// Two CPU-bound threads on one core share it equally, switching at
    /// slice ends; a third at nice 5 gets about a third of their share.
    #[test]
    fn cpu_bound_threads_share_a_core_by_weight() {
        let mut s = HostScheduler::new(1);
        let a = s.add_thread(0, CpuMask::from_bits(1), 0);
        let b = s.add_thread(0, CpuMask::from_bits(1), 0);
        let c = s.add_thread(5, CpuMask::from_bits(1), 0);
        let mut now = 0;
        for t in [a, b, c] {
            s.wake(t, now);
        }
        s.pick_next(0, now);
        let tick = MS;
        for _ in 0..3000 {
            now += tick;
            if s.tick(0, now) {
                s.pick_next(0, now);
            }
        }
        s.update_curr(0, now);
        let (ea, eb, ec) = (
            s.thread(a).sum_exec as f64,
            s.thread(b).sum_exec as f64,
            s.thread(c).sum_exec as f64,
        );
        assert!((ea / eb - 1.0).abs() < 0.05, "{ea} vs {eb}");
        let want = 335.0 / 1024.0;
        assert!((ec / ea - want).abs() < 0.08, "nice 5 got {}", ec / ea);
        assert!(s.thread(a).preemptions > 100);
        // Waiting time is what the others ran.
        let total = (ea + eb + ec) as u64;
        assert!(total <= now && total + 2 * tick >= now);
        assert!(s.thread(a).wait_time > 0);
    }

    #[test]
    fn a_sleeper_waking_far_behind_preempts_but_only_beyond_the_granularity() {
        let mut s = HostScheduler::new(1);
        let hog = s.add_thread(0, CpuMask::from_bits(1), 0);
        let io = s.add_thread(0, CpuMask::from_bits(1), 0);
        s.wake(hog, 0);
        s.pick_next(0, 0);
        // The hog runs 20 ms alone; the I/O thread wakes: placed at
        // min_vruntime - latency/2, which is > wakeup_granularity behind.
        assert_eq!(s.wake(io, 20 * MS), Some(Wake::Preempt { core: 0 }));
        let (prev, next) = s.pick_next(0, 20 * MS);
        assert_eq!((prev, next), (Some(hog), Some(io)));
        // Placed 3 ms (latency/2) behind, it runs 2.5 ms and blocks: now
        // 0.5 ms behind the hog, which resumes.
        assert_eq!(s.block(0, 22 * MS + 500 * US), Some(io));
        assert_eq!(s.pick_next(0, 22 * MS + 500 * US).1, Some(hog));
        // Woken again 100 us later it is less than the 1 ms granularity
        // behind: it waits for the hog's slice to end.
        assert_eq!(
            s.wake(io, 22 * MS + 600 * US),
            Some(Wake::Queued { core: 0 })
        );
        assert_eq!(s.thread(io).wait_time, 0);
        assert!(s.slice_end(0, 22 * MS + 600 * US).is_some());
    }

    #[test]
    fn wakeups_prefer_an_idle_allowed_core_and_pinning_is_respected() {
        let mut s = HostScheduler::new(3);
        let a = s.add_thread(0, CpuMask::from_bits(0b011), 0);
        let b = s.add_thread(0, CpuMask::from_bits(0b011), 0);
        let pinned = s.add_thread(0, CpuMask::from_bits(0b100), 0);
        assert_eq!(s.wake(a, 0), Some(Wake::RunIdle { core: 0 }));
        s.pick_next(0, 0);
        assert_eq!(s.wake(b, 0), Some(Wake::RunIdle { core: 1 }));
        assert_eq!(s.wake(pinned, 0), Some(Wake::RunIdle { core: 2 }));
        assert_eq!(s.thread(pinned).core, 2);
    }

    #[test]
    fn an_idle_core_pulls_a_waiting_thread_it_may_run() {
        let mut s = HostScheduler::new(2);
        let a = s.add_thread(0, CpuMask::from_bits(0b01), 0);
        let b = s.add_thread(0, CpuMask::from_bits(0b11), 0);
        s.wake(a, 0);
        s.pick_next(0, 0);
        // b may run on either core; core 1 is busy with nothing, but b's
        // home is 0 and 0 is busy: it goes to idle core 1 directly.
        assert_eq!(s.wake(b, 0), Some(Wake::RunIdle { core: 1 }));
        // Force b to queue on core 0 by making it the only choice, then
        // let core 1 pull it.
        let mut s = HostScheduler::new(2);
        let a = s.add_thread(0, CpuMask::from_bits(0b01), 0);
        let blocker = s.add_thread(0, CpuMask::from_bits(0b10), 1);
        let b = s.add_thread(0, CpuMask::from_bits(0b11), 0);
        s.wake(a, 0);
        s.pick_next(0, 0);
        s.wake(blocker, 0);
        s.pick_next(1, 0);
        assert_eq!(s.wake(b, 0), Some(Wake::Queued { core: 0 }));
        s.block(1, 5 * MS);
        let (_, next) = s.pick_next(1, 5 * MS);
        assert_eq!(next, Some(b));
        assert_eq!(s.thread(b).core, 1);
        assert_eq!(s.thread(b).wait_time, 5 * MS);
    }

    /// Three floating threads queued on core 0 while core 1 runs one
    /// pinned thread: periodic balancing on core 1 pulls one (loads 2:2),
    /// never a cache-hot one, and stops once balanced.
    #[test]
    fn periodic_balance_pulls_what_the_pinning_allows_until_balanced() {
        let mut s = HostScheduler::new(2);
        let pinned = s.add_thread(0, CpuMask::from_bits(0b10), 1);
        let f: Vec<Tid> = (0..3)
            .map(|_| s.add_thread(0, CpuMask::from_bits(0b11), 0))
            .collect();
        s.wake(pinned, 0);
        s.pick_next(1, 0);
        for &t in &f {
            s.wake(t, 0);
        }
        s.pick_next(0, 0);
        assert_eq!((s.nr_running(0), s.nr_running(1)), (3, 1));
        // f[0] runs on core 0; the two waiting never ran: not cache-hot.
        assert!(s.balance(1, MS));
        assert_eq!((s.nr_running(0), s.nr_running(1)), (2, 2));
        let moved = f.iter().filter(|&&t| s.thread(t).core == 1).count();
        assert_eq!(moved, 1);
        assert_eq!(f.iter().map(|&t| s.thread(t).migrations).sum::<u64>(), 1);
        // Not due again before the busy core's interval (2 ms x 32).
        assert!(!s.balance(1, 2 * MS));
        // Balanced: nothing moves when due.
        assert!(!s.balance(1, 100 * MS));
        assert_eq!((s.nr_running(0), s.nr_running(1)), (2, 2));
    }

    #[test]
    fn a_thread_that_just_ran_is_cache_hot_and_stays() {
        let mut s = HostScheduler::new(2);
        let a = s.add_thread(0, CpuMask::from_bits(0b11), 0);
        let b = s.add_thread(0, CpuMask::from_bits(0b11), 0);
        let blocker = s.add_thread(0, CpuMask::from_bits(0b10), 1);
        s.wake(blocker, 0);
        s.pick_next(1, 0);
        s.wake(a, 0);
        s.pick_next(0, 0);
        s.wake(b, 0);
        // b runs 1 ms, then a takes over: b waits, cache-hot for 0.5 ms.
        s.pick_next(0, 0);
        let t1 = 10 * MS;
        let (_, next) = s.pick_next(0, t1);
        let waiting = if next == Some(a) { b } else { a };
        s.block(1, t1);
        // Core 1 idle: balancing 0.1 ms after `waiting` ran leaves it.
        assert!(!s.balance(1, t1 + 100 * US));
        // Later (idle interval 2 ms) it moves.
        assert!(s.balance(1, t1 + 3 * MS));
        assert_eq!(s.thread(waiting).core, 1);
    }

    /// Two threads of one group runnable on one core are stacked until one
    /// leaves; threads of other groups or none do not count.
    #[test]
    fn siblings_runnable_on_one_core_are_stacked() {
        let mut s = HostScheduler::new(2);
        let a = s.add_thread(0, CpuMask::from_bits(0b01), 0);
        let b = s.add_thread(0, CpuMask::from_bits(0b01), 0);
        let other = s.add_thread(0, CpuMask::from_bits(0b01), 0);
        s.set_group(a, 0);
        s.set_group(b, 0);
        s.set_group(other, 1);
        s.wake(a, 0);
        s.pick_next(0, 0);
        s.wake(other, MS);
        assert_eq!(s.stacked_time(0, 2 * MS), 0);
        s.wake(b, 2 * MS);
        assert_eq!(s.stacked_time(0, 5 * MS), 3 * MS);
        // a blocks at 6 ms: b is alone again.
        s.block(0, 6 * MS);
        assert_eq!(s.stacked_time(0, 9 * MS), 4 * MS);
        assert_eq!(s.stacked_time(1, 9 * MS), 0);
    }

    proptest! {
        /// Any sequence of wakes, blocks, ticks and picks keeps every
        /// thread in exactly one place, on a core it may use, and the
        /// queue loads equal the weights they hold.
        #[test]
        fn run_queues_stay_consistent(ops in proptest::collection::vec((0u8..4, 0usize..6, 0usize..3), 1..300)) {
            let mut s = HostScheduler::new(3);
            let masks = [0b001, 0b011, 0b111, 0b100, 0b110, 0];
            for (i, m) in masks.iter().enumerate() {
                let t = s.add_thread((i as i32) - 2, CpuMask::from_bits(*m), i % 3);
                s.set_group(t, i % 2);
            }
            let mut now = 0;
            for (op, t, core) in ops {
                now += 37 * US;
                match op {
                    0 => { s.wake(t, now); }
                    1 => { s.block(core, now); }
                    2 => {
                        if s.tick(core, now) { s.pick_next(core, now); }
                        s.balance(core, now);
                        s.dequeue(t, now);
                    }
                    _ => { s.pick_next(core, now); }
                }
                let mut seen = vec![0; s.threads()];
                for c in 0..3 {
                    let rq = &s.rqs[c];
                    let mut load = 0;
                    for &q in rq.queued.iter().chain(rq.curr.iter()) {
                        seen[q] += 1;
                        prop_assert!(s.thread(q).allowed.contains(c));
                        prop_assert_eq!(s.thread(q).core, c);
                        prop_assert!(s.thread(q).runnable);
                        load += s.thread(q).weight;
                    }
                    prop_assert_eq!(load, rq.load);
                }
                for (i, n) in seen.iter().enumerate() {
                    prop_assert_eq!(*n, s.thread(i).runnable as i32);
                }
                // The stacking counts follow the run queues.
                for g in 0..2 {
                    let mut stacked = 0;
                    for c in 0..3 {
                        let rq = &s.rqs[c];
                        let n = rq.queued.iter().chain(rq.curr.iter())
                            .filter(|&&q| s.thread(q).group == Some(g)).count();
                        prop_assert_eq!(n, s.groups[g].on_core[c] as usize);
                        stacked += (n >= 2) as usize;
                    }
                    prop_assert_eq!(stacked, s.groups[g].stacked_cores);
                }
            }
        }
    }
}
