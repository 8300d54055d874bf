//! The host scheduler in the world: vCPU threads and host threads
//! (burners) multiplexed on cores by [`HostScheduler`]. Every switch away
//! from a vCPU is a schedule-out through the scheme's `vcpu_put` (deferred
//! to the end of an exit in progress, as KVM only schedules between exits),
//! every switch to one a schedule-in through `vcpu_load`.
//!
//! A burner needs no model of its own: while it runs, the core is in host
//! context ([`CoreMode::Idle`]), where host interrupts are taken at once.

use super::event::Ev;
use super::World;
use crate::engine::Time;
use crate::guest::app::Metrics;
use crate::hv::sched::{HostScheduler, Tid, Wake};
use crate::hw::x86::core::CoreMode;
use crate::scenario::Scenario;
use crate::world::vcanal::CanalThread;

/// A vCPU thread as the scheduler is given it.
#[derive(Clone, Copy, Debug)]
pub struct VcpuThread {
    /// Its VM (the group vCPU stacking is measured over).
    pub vm: usize,
    /// The core it starts on.
    pub core: usize,
    /// The cores it may run on (bit i = core i).
    pub allowed: crate::engine::CpuMask,
}

/// The vCanal service's threads as the scheduler is given them: the
/// polling thread and the network pool's threads, each a thread of its
/// own (vcanal.md §2.4).
#[derive(Clone, Copy, Debug)]
pub struct CanalThreads {
    /// The service core: where they start.
    pub core: usize,
    /// The cores they may run on (with affinity the service core; without,
    /// every core: `CpuMask::EMPTY`).
    pub allowed: crate::engine::CpuMask,
    /// Network-pool threads.
    pub pool: usize,
    /// The polling thread's nice level (the pool's is 0).
    pub poller_nice: i32,
}

/// A thread of a peer process on this host (`host.peer_cores`) as the
/// scheduler is given it: CPU `cpu` of peer link `link`.
#[derive(Clone, Copy, Debug)]
pub struct PeerThreadSpec {
    /// The peer link.
    pub link: usize,
    /// Which of the peer's CPUs it is.
    pub cpu: usize,
    /// The core it starts on.
    pub core: usize,
    /// The cores it may run on.
    pub allowed: crate::engine::CpuMask,
}

/// The scheduler and what the world keeps about it.
pub struct SchedState {
    /// The policy.
    pub s: HostScheduler,
    /// Per core: the vCPU to schedule in once the one leaving finishes
    /// its exit.
    switch_to: Vec<Option<Tid>>,
    /// The scheduler tick period.
    tick: Time,
    /// Per vCPU thread: (wait, switches in) at the end of the warm-up.
    base: Vec<(Time, u64)>,
    /// Switches the scheme deferred (its vCPU was not preemptible).
    deferred: u64,
    /// vCPU halts (HLT exits that put the thread to sleep).
    halts: u64,
    /// Time spent halt-polling, and polls that ended with an interrupt.
    poll_time: Time,
    poll_success: u64,
    /// Threads from `io_base` on are vhost workers: the worker of each.
    io_base: Tid,
    io_workers: Vec<usize>,
    /// The vCanal service's polling thread, then its pool threads from
    /// `canal_pool` (`canal_pool_n` of them).
    canal: Option<Tid>,
    canal_pool: Tid,
    canal_pool_n: usize,
    /// kvm-tools' back-end threads from `kvmtool_base` on
    /// (`kvmtool_n` of them; thread i is the back end's thread i).
    kvmtool_base: Tid,
    kvmtool_n: usize,
    /// Peer processes' threads from `peer_base` on: (link, CPU) of each.
    peer_base: Tid,
    peer_threads: Vec<(usize, usize)>,
    /// Per peer thread: (run time, wait) at the end of the warm-up.
    peer_stats_base: Vec<(Time, Time)>,
    /// Per vCPU: reported as a lost wake-up.
    stalled: Vec<bool>,
    /// vCPU loads on a core other than the one their VMCS was on.
    pub(super) migrations: u64,
    /// Per VM of two or more vCPUs: its stacked time at the end of the
    /// warm-up.
    stacked_base: Vec<Time>,
}

impl SchedState {
    /// The scheduler a scenario asks for: none unless it has host threads
    /// or threads that share a core.
    /// Threads 0..vcpus are the vCPU threads (pinned to their cores), then
    /// the burners, then the vhost workers (of `io_cores`, one entry per
    /// worker) that share their core with another thread; a worker alone
    /// on its core runs whenever it has work, outside the scheduler. Last,
    /// the vCanal service's polling thread and its pool threads, then
    /// kvm-tools' back-end threads, each starting on its core in
    /// `kvmtool_cores`, pinned there with `net.kvmtool_affinity` (they
    /// always share a core with each other) and free to run on every core
    /// without.
    pub fn build(
        s: &Scenario,
        vcpus: &[VcpuThread],
        io_cores: &[usize],
        canal: Option<CanalThreads>,
        kvmtool_cores: &[usize],
        peers: &[PeerThreadSpec],
        tick: Time,
    ) -> Option<SchedState> {
        let vcpu_cores: Vec<usize> = vcpus.iter().map(|v| v.core).collect();
        let floating = vcpus.iter().any(|v| v.allowed.count() > 1);
        let shared =
            floating || (1..vcpu_cores.len()).any(|i| vcpu_cores[..i].contains(&vcpu_cores[i]));
        let halts = s.guest.idle == crate::guest::IdleMode::Halt;
        let burner_on = |c: usize| {
            s.host.burners.iter().any(|b| b.cores.contains(&c))
                || peers.iter().any(|p| p.allowed.contains(c))
        };
        let io_shared: Vec<usize> = (0..io_cores.len())
            .filter(|&w| {
                let c = io_cores[w];
                s.host.vhost_unpinned
                    || vcpu_cores.contains(&c)
                    || burner_on(c)
                    || io_cores.iter().enumerate().any(|(k, &o)| k != w && o == c)
            })
            .collect();
        if s.host.burners.is_empty()
            && !shared
            && !halts
            && io_shared.is_empty()
            && canal.is_none()
            && kvmtool_cores.is_empty()
            && peers.is_empty()
        {
            return None;
        }
        let mut sched = HostScheduler::new(s.machine.cores);
        let skew = s.host.vcpu_start_skew_ms * 1e-3;
        let mut rng = crate::engine::RngStream::new(s.seed, "vcpu-start-skew");
        let nvm = vcpus.iter().map(|v| v.vm + 1).max().unwrap_or(0);
        for v in vcpus {
            let t = sched.add_thread(s.host.vcpu_nice, v.allowed, v.core);
            sched.set_group(t, v.vm);
            if skew > 0.0 {
                sched.set_vruntime(t, crate::engine::from_s(rng.uniform() * skew));
            }
        }
        for b in &s.host.burners {
            let mask = crate::engine::CpuMask::of(b.cores.iter().copied());
            sched.add_thread(b.nice, mask, b.cores[0]);
        }
        let io_base = sched.threads();
        for &w in &io_shared {
            let c = io_cores[w];
            let allowed = if s.host.vhost_unpinned {
                crate::engine::CpuMask::EMPTY
            } else {
                crate::engine::CpuMask::single(c)
            };
            sched.add_thread(0, allowed, c);
        }
        let canal_pool_n = canal.map_or(0, |c| c.pool);
        let poller = canal.map(|c| sched.add_thread(c.poller_nice, c.allowed, c.core));
        let canal_pool = sched.threads();
        for _ in 0..canal_pool_n {
            if let Some(c) = canal {
                sched.add_thread(0, c.allowed, c.core);
            }
        }
        let canal = poller;
        let kvmtool_base = sched.threads();
        for &c in kvmtool_cores {
            let allowed = if s.net.kvmtool_affinity {
                crate::engine::CpuMask::single(c)
            } else {
                crate::engine::CpuMask::EMPTY
            };
            sched.add_thread(0, allowed, c);
        }
        let peer_base = sched.threads();
        for p in peers {
            sched.add_thread(0, p.allowed, p.core);
        }
        Some(SchedState {
            s: sched,
            switch_to: vec![None; s.machine.cores],
            tick: tick.max(1),
            base: vec![(0, 0); vcpu_cores.len()],
            migrations: 0,
            stalled: vec![false; vcpus.len()],
            stacked_base: vec![0; nvm],
            deferred: 0,
            halts: 0,
            poll_time: 0,
            poll_success: 0,
            io_base,
            io_workers: io_shared,
            canal,
            canal_pool,
            canal_pool_n,
            kvmtool_base,
            kvmtool_n: kvmtool_cores.len(),
            peer_base,
            peer_threads: peers.iter().map(|p| (p.link, p.cpu)).collect(),
            peer_stats_base: vec![(0, 0); peers.len()],
        })
    }

    /// Which of kvm-tools' back-end threads scheduler thread `t` is.
    pub(super) fn kvmtool_of(&self, t: Tid) -> Option<usize> {
        t.checked_sub(self.kvmtool_base)
            .filter(|&i| i < self.kvmtool_n)
    }

    /// Which peer thread (link, CPU) scheduler thread `t` is.
    pub(super) fn peer_of(&self, t: Tid) -> Option<(usize, usize)> {
        t.checked_sub(self.peer_base)
            .and_then(|i| self.peer_threads.get(i).copied())
    }

    /// The scheduler thread of peer link `link`'s CPU `cpu`.
    pub(super) fn peer_tid(&self, link: usize, cpu: usize) -> Option<Tid> {
        self.peer_threads
            .iter()
            .position(|&p| p == (link, cpu))
            .map(|i| self.peer_base + i)
    }

    /// The vhost worker scheduler thread `t` is, if any.
    pub(super) fn io_worker_of(&self, t: Tid) -> Option<usize> {
        self.io_worker(t)
    }

    fn io_worker(&self, t: Tid) -> Option<usize> {
        t.checked_sub(self.io_base)
            .and_then(|i| self.io_workers.get(i).copied())
    }

    /// The vCanal service's polling thread, if any.
    pub(super) fn canal_thread(&self) -> Option<Tid> {
        self.canal
    }

    /// The scheduler thread of the vCanal service's thread `who`.
    pub(super) fn canal_tid(&self, who: CanalThread) -> Option<Tid> {
        match who {
            CanalThread::Poller => self.canal,
            CanalThread::Pool(i) => (i < self.canal_pool_n).then_some(self.canal_pool + i),
        }
    }

    /// Which of the vCanal service's threads scheduler thread `t` is.
    pub(super) fn canal_of(&self, t: Tid) -> Option<CanalThread> {
        if self.canal == Some(t) {
            return Some(CanalThread::Poller);
        }
        t.checked_sub(self.canal_pool)
            .filter(|&i| i < self.canal_pool_n)
            .map(CanalThread::Pool)
    }

    /// A vCPU was loaded on a core other than its VMCS's.
    pub fn note_migration(&mut self) {
        self.migrations += 1;
    }

    /// The cores any thread may run on (they get scheduler ticks).
    fn cores(&self) -> crate::engine::CpuMask {
        (0..self.s.threads()).fold(crate::engine::CpuMask::EMPTY, |m, t| {
            m.union(self.s.thread(t).allowed)
        })
    }
}

impl World {
    /// Starts the scheduler at time 0: every thread is runnable, the
    /// vCPUs (already loaded by the builder) are current on their cores,
    /// and each scheduled core gets its tick.
    pub(super) fn sched_start(&mut self) {
        let Some(st) = &mut self.sched else { return };
        let vcpus = self.hv.vcpus.len();
        // The vCPUs the builder loaded first, on their cores; then the
        // others queue behind them or, if they may, take idle cores (and
        // are scheduled in there).
        let loaded = |t: usize| self.hv.vcpus[t].loaded;
        for t in (0..vcpus).filter(|&t| loaded(t)) {
            if let Some(Wake::RunIdle { core }) = st.s.wake(t, 0) {
                st.s.pick_next(core, 0);
            }
        }
        for t in (0..vcpus).filter(|&t| !loaded(t)) {
            if let Some(Wake::RunIdle { core }) = st.s.wake(t, 0) {
                st.s.pick_next(core, 0);
                self.q.schedule(0, Ev::Reschedule { vcpu: t as u16 });
            }
        }
        for t in (vcpus..st.io_base).chain(st.canal) {
            // Burners and the floating vCanal service queue behind the
            // vCPUs or run on idle cores; vhost workers sleep until work
            // is queued.
            if let Some(Wake::RunIdle { core }) = st.s.wake(t, 0) {
                st.s.pick_next(core, 0);
            }
        }
        let canal_on = st
            .canal
            .map(|t| st.s.current(st.s.thread(t).core) == Some(t));
        let cores = st.cores();
        let tick = st.tick;
        for c in 0..self.m.cores.len() {
            if cores.contains(c) {
                self.q.schedule(tick, Ev::SchedTick { core: c as u16 });
            }
        }
        if let Some(on) = canal_on {
            self.canal_thread_started(on);
        }
    }

    /// `scheduler_tick` on `core`: the running thread's slice is checked.
    pub(super) fn sched_tick(&mut self, core: usize) {
        let now = self.q.now();
        let Some(st) = &mut self.sched else { return };
        self.q
            .schedule(now + st.tick, Ev::SchedTick { core: core as u16 });
        // The scheduler agrees with the vCPUs: one not halted is runnable
        // (each such vCPU is reported once).
        for v in 0..self.hv.vcpus.len() {
            let th = st.s.thread(v);
            if th.core == core && !th.runnable && !self.hv.vcpus[v].halted && !st.stalled[v] {
                st.stalled[v] = true;
                self.checker.lost_wakeup(v, now);
            }
        }
        if self.el2.is_some() {
            self.el2_sched_check(core);
        }
        let Some(st) = &mut self.sched else { return };
        let pulled = st.s.balance(core, now);
        if st.s.tick(core, now) || (pulled && st.s.current(core).is_none()) {
            self.sched_switch(core);
        }
    }

    /// `schedule()` on `core`: switch to the thread CFS picks.
    pub(super) fn sched_switch(&mut self, core: usize) {
        self.sched_switch_to_pick(core);
        self.trace_sched(core);
    }

    fn sched_switch_to_pick(&mut self, core: usize) {
        let now = self.q.now();
        let vcpus = self.hv.vcpus.len();
        let curr = self.sched.as_ref().and_then(|st| st.s.current(core));
        if let Some(v) = curr.filter(|&v| v < vcpus) {
            let polling = self.is_polling(v);
            let (cx, scheme) = self.cx();
            if polling || !scheme.preemptible(&cx, v) {
                // need_resched stays set: the next tick tries again.
                if let Some(st) = &mut self.sched {
                    st.deferred += 1;
                }
                return;
            }
        }
        let Some(st) = &mut self.sched else { return };
        let (prev, next) = st.s.pick_next(core, now);
        if prev == next {
            return;
        }
        let (prev_io, next_io) = (
            prev.and_then(|p| st.io_worker(p)),
            next.and_then(|n| st.io_worker(n)),
        );
        let (prev_canal, next_canal) = (
            prev.and_then(|p| st.canal_of(p)),
            next.and_then(|n| st.canal_of(n)),
        );
        let (prev_kt, next_kt) = (
            prev.and_then(|p| st.kvmtool_of(p)),
            next.and_then(|n| st.kvmtool_of(n)),
        );
        let (prev_peer, next_peer) = (
            prev.and_then(|p| st.peer_of(p)),
            next.and_then(|n| st.peer_of(n)),
        );
        if let Some((l, c)) = prev_peer {
            self.peer_thread_switched_out(l, c);
        }
        if let Some((l, c)) = next_peer {
            self.peer_thread_switched_in(l, c);
        }
        if let Some(w) = prev_io {
            self.vhost_switched_out(w);
        }
        if let Some(t) = prev_kt {
            self.kvmtool_switched_out(t);
        }
        if let Some(t) = next_kt {
            self.kvmtool_switched_in(t, 0);
        }
        if let Some(who) = prev_canal {
            self.canal_switched_out(who);
        }
        if let Some(who) = next_canal {
            self.canal_switched_in(who, core, 0);
        }
        if let Some(p) = prev.filter(|&p| p < vcpus) {
            self.deschedule(p);
        }
        if let Some(w) = next_io {
            self.vhost_switched_in(w, 0);
        }
        let Some(n) = next.filter(|&n| n < vcpus) else {
            return;
        };
        let pending_out =
            self.deschedule_pending[n] && self.m.cores[core].mode == (CoreMode::Host { vcpu: n });
        if self.m.cores[core].mode == CoreMode::Idle || pending_out {
            // Idle core: load it now; still finishing the exit it was to
            // leave at: it simply stays.
            self.reschedule(n);
        } else if let Some(st) = &mut self.sched {
            st.switch_to[core] = Some(n);
        }
    }

    /// The kicks a scheme asked for (kvm_vcpu_kick), as a mask of vCPUs
    /// that `take` empties: each is kicked, lowest first, until kicking
    /// leaves no new ones.
    pub(super) fn drain_kicks(
        &mut self,
        take: impl Fn(&mut World) -> u64,
        kick: impl Fn(&mut World, usize),
    ) {
        loop {
            let mut k = take(self);
            if k == 0 {
                return;
            }
            while k != 0 {
                let v = k.trailing_zeros() as usize;
                k &= k - 1;
                kick(self, v);
            }
        }
    }

    /// A schedule-in's bookkeeping, the same on every architecture: the
    /// core in host mode under `vcpu`'s thread, the checker told it runs,
    /// the scheme's load (`load`, which returns what it charged), the
    /// vCPU's last core and a migration counted when the core changed.
    pub(super) fn load_vcpu_on(
        &mut self,
        core: usize,
        vcpu: usize,
        now: Time,
        load: impl FnOnce(&mut World) -> Time,
    ) -> Time {
        let migrated = self.hv.vcpus[vcpu].vmcs_core.is_some_and(|c| c != core);
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.checker.set_running(vcpu, true, now);
        let charged = load(self);
        self.hv.vcpus[vcpu].vmcs_core = Some(core);
        self.hv.last_vcpu[core] = Some(vcpu);
        if migrated {
            if let Some(st) = &mut self.sched {
                st.note_migration();
            }
        }
        charged
    }

    /// `kvm_vcpu_halt`: halted `vcpu` (its HLT exit done, nothing
    /// pending) polls for the scheme's window, or sleeps at once.
    pub(super) fn halt(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        self.halt_start[vcpu] = now;
        let window = self.scheme.halt_poll_window(vcpu);
        // Polling only while nothing else wants the core
        // (`single_task_running`).
        // A vCPU whose core the scheduler already gave to another thread
        // (switched away from during its HLT exit) does not poll either.
        let others = self
            .sched
            .as_ref()
            .is_some_and(|st| st.s.nr_running(core) > 1 || st.s.current(core) != Some(vcpu));
        if window == 0 || others {
            return self.sched_block(core, vcpu);
        }
        // The vCPU thread spins in host mode on its core.
        self.poll_gen += 1;
        self.polling[vcpu] = Some((now, self.poll_gen));
        self.q.schedule(
            now + window,
            Ev::HaltPollEnd {
                vcpu: vcpu as u16,
                gen: self.poll_gen,
            },
        );
        self.halt_poll_check(core, vcpu);
    }

    /// While polling: host interrupts are taken at once, then the vCPU
    /// resumes if one left something pending for it.
    pub(super) fn halt_poll_check(&mut self, core: usize, vcpu: usize) {
        if self.polling[vcpu].is_none() || self.exits[core].is_some() {
            return;
        }
        self.idle_host_interrupts(core);
        let runnable = {
            let (cx, scheme) = self.cx();
            scheme.vcpu_has_interrupt(&cx, vcpu)
        };
        if runnable {
            self.halt_poll_success(core, vcpu);
        }
    }

    /// An interrupt came within the window: no sleep, no schedule-out.
    fn halt_poll_success(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        let Some((start, _)) = self.polling[vcpu].take() else {
            return;
        };
        self.hv.vcpus[vcpu].halted = false;
        self.checker.set_blocked(vcpu, false, self.q.now());
        self.note_poll(now - start, true);
        let block = now - self.halt_start[vcpu];
        self.scheme.halt_ended(vcpu, block, true);
        self.resume(core, vcpu);
    }

    /// Another thread became runnable on `core`: a vCPU polling there
    /// stops and sleeps (the poll loop checks `single_task_running`).
    fn stop_polling_on(&mut self, core: usize) {
        let Some(v) = self.sched.as_ref().and_then(|st| st.s.current(core)) else {
            return;
        };
        if v < self.hv.vcpus.len() {
            if let Some((_, gen)) = self.polling[v] {
                self.halt_poll_end(v, gen);
            }
            if self.el2.is_some() {
                self.el2_stop_polling(v);
            }
        }
    }

    /// The window ran out: the thread sleeps.
    pub(super) fn halt_poll_end(&mut self, vcpu: usize, gen: u64) {
        match self.polling[vcpu] {
            Some((start, g)) if g == gen => {
                let core = self.hv.vcpus[vcpu].core;
                // kvm_vcpu_check_block, the poll loop's last look: a
                // request posted without a host interrupt yet (an IPI
                // virtualization or VT-d post whose notification is still
                // in flight) ends the halt here. Blocking on it would
                // leave it stranded: its notification arrives with the
                // guest's vector, not the wake-up vector.
                let runnable = {
                    let (cx, scheme) = self.cx();
                    scheme.vcpu_has_interrupt(&cx, vcpu)
                };
                if runnable && self.exits[core].is_none() {
                    return self.halt_poll_success(core, vcpu);
                }
                self.polling[vcpu] = None;
                let now = self.q.now();
                self.note_poll(now - start, false);
                self.sched_block(core, vcpu);
            }
            _ => {}
        }
    }

    fn note_poll(&mut self, spun: Time, success: bool) {
        if let Some(st) = &mut self.sched {
            st.poll_time += spun;
            st.poll_success += success as u64;
        }
    }

    /// Whether `vcpu` is polling in a halt.
    pub(super) fn is_polling(&self, vcpu: usize) -> bool {
        self.polling[vcpu].is_some() || self.el2.as_ref().is_some_and(|a| a.is_polling(vcpu))
    }

    /// Whether another thread wants `core` than `vcpu`'s
    /// (`single_task_running` is false): a halted vCPU then blocks at once
    /// instead of polling.
    pub(super) fn sched_core_contended(&self, core: usize, vcpu: usize) -> bool {
        self.sched
            .as_ref()
            .is_some_and(|st| st.s.nr_running(core) > 1 || st.s.current(core) != Some(vcpu))
    }

    /// `kvm_vcpu_block`: halted `vcpu` gives up `core` (its HLT exit is
    /// done); the scheduler runs the next thread there, if any.
    pub(super) fn sched_block(&mut self, core: usize, vcpu: usize) {
        self.sched_block_vcpu(core, vcpu);
        self.trace_sched(core);
    }

    fn sched_block_vcpu(&mut self, core: usize, vcpu: usize) {
        self.deschedule_pending[vcpu] = false;
        {
            let (mut cx, scheme) = self.cx();
            scheme.vcpu_blocking(&mut cx, vcpu);
        }
        self.put(core, vcpu);
        self.sched_vcpu_blocked(core, vcpu);
    }

    /// The scheduler's side of `kvm_vcpu_block` once `vcpu` is put: its
    /// thread sleeps and `core` runs the next thread (both architectures).
    pub(super) fn sched_vcpu_blocked(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        let vcpus = self.hv.vcpus.len();
        let Some(st) = &mut self.sched else { return };
        st.halts += 1;
        if st.s.current(core) != Some(vcpu) {
            // The scheduler had already switched the core to another thread
            // (loaded by `put`, which ended the deferred schedule-out): the
            // vCPU's thread leaves the run queue it waited in.
            st.s.dequeue(vcpu, now);
            return;
        }
        st.s.block(core, now);
        let (_, next) = st.s.pick_next(core, now);
        self.switched_to(next, vcpus);
    }

    /// The core picked `next` after its thread blocked: a vCPU is
    /// scheduled in, a vhost worker goes on with its work.
    fn switched_to(&mut self, next: Option<Tid>, vcpus: usize) {
        let Some(n) = next else { return };
        if n < vcpus {
            self.reschedule(n);
        } else if let Some(w) = self.sched.as_ref().and_then(|st| st.io_worker(n)) {
            self.vhost_switched_in(w, 0);
        } else if let Some(t) = self.sched.as_ref().and_then(|st| st.kvmtool_of(n)) {
            self.kvmtool_switched_in(t, 0);
        } else if let Some((l, c)) = self.sched.as_ref().and_then(|st| st.peer_of(n)) {
            self.peer_thread_switched_in(l, c);
        } else if let Some((who, core)) = self
            .sched
            .as_ref()
            .and_then(|st| st.canal_of(n).map(|who| (who, st.s.thread(n).core)))
        {
            self.canal_switched_in(who, core, 0);
        }
    }

    /// Gives each vhost worker that shares its core its scheduler thread
    /// (it starts asleep, off the core).
    pub(super) fn sched_io_threads(&mut self) {
        let Some(st) = &self.sched else { return };
        if let Some(k) = &mut self.kvmtool {
            for (i, t) in k.threads.iter_mut().enumerate() {
                t.tid = st.kvmtool_base + i;
                t.on_cpu = false;
            }
        }
        let Some(pv) = &mut self.pv else { return };
        for (i, &w) in st.io_workers.iter().enumerate() {
            pv.threads[w].tid = Some(st.io_base + i);
            pv.threads[w].on_cpu = false;
        }
    }

    /// A sleeping thread (a kicked vCPU, a vhost worker given work) wakes:
    /// after the wake-up latency `lat` it runs, at once on an idle core, by
    /// preempting the current thread as CFS decides, or in its turn.
    pub(super) fn sched_wake_thread(&mut self, tid: Tid, lat: Time) {
        self.sched_wake(tid, lat);
        self.trace_sched_of(tid);
    }

    fn sched_wake(&mut self, tid: Tid, lat: Time) {
        let now = self.q.now();
        let vcpus = self.hv.vcpus.len();
        let Some(st) = &mut self.sched else { return };
        match st.s.wake(tid, now) {
            Some(Wake::RunIdle { core }) => {
                st.s.pick_next(core, now);
                if tid < vcpus {
                    self.q
                        .schedule(now + lat, Ev::Reschedule { vcpu: tid as u16 });
                } else if let Some(w) = st.io_worker(tid) {
                    self.vhost_switched_in(w, lat);
                } else if let Some(t) = st.kvmtool_of(tid) {
                    self.kvmtool_switched_in(t, lat);
                } else if let Some(who) = st.canal_of(tid) {
                    self.canal_switched_in(who, core, lat);
                } else if let Some((l, c)) = st.peer_of(tid) {
                    self.peer_thread_switched_in(l, c);
                }
            }
            Some(Wake::Preempt { core }) => {
                self.stop_polling_on(core);
                self.q
                    .schedule(now + lat, Ev::Resched { core: core as u16 })
            }
            Some(Wake::Queued { core }) => self.stop_polling_on(core),
            None => {}
        }
    }

    /// The running host thread `tid` (a vhost worker out of work) blocks;
    /// its core runs the next thread.
    pub(super) fn sched_block_thread(&mut self, tid: Tid) {
        self.sched_block_host_thread(tid);
        // Blocking does not move the thread: its core is the one it left.
        self.trace_sched_of(tid);
    }

    /// Host thread `tid` goes to sleep: it blocks if it runs, or leaves
    /// the run queue it waits in (it was preempted while its last work
    /// item finished).
    pub(super) fn sched_sleep_thread(&mut self, tid: Tid) {
        let now = self.q.now();
        let Some(st) = &mut self.sched else { return };
        let core = st.s.thread(tid).core;
        if st.s.current(core) == Some(tid) {
            self.sched_block_thread(tid);
        } else {
            st.s.dequeue(tid, now);
        }
    }

    /// `sched_yield` by running host thread `tid`: its core switches to
    /// another waiting thread, if there is one. Returns whether it did.
    pub(super) fn sched_yield_thread(&mut self, tid: Tid) -> bool {
        let now = self.q.now();
        let vcpus = self.hv.vcpus.len();
        let Some(st) = &mut self.sched else {
            return false;
        };
        let core = st.s.thread(tid).core;
        if st.s.current(core) != Some(tid) {
            return false;
        }
        let Some((_, next)) = st.s.yield_curr(core, now) else {
            return false;
        };
        if let Some(who) = st.canal_of(tid) {
            self.canal_switched_out(who);
        }
        if let Some(w) = self.sched.as_ref().and_then(|st| st.io_worker(tid)) {
            self.vhost_switched_out(w);
        }
        if let Some(t) = self.sched.as_ref().and_then(|st| st.kvmtool_of(tid)) {
            self.kvmtool_switched_out(t);
        }
        if let Some((l, c)) = self.sched.as_ref().and_then(|st| st.peer_of(tid)) {
            self.peer_thread_switched_out(l, c);
        }
        self.switched_to(next, vcpus);
        self.trace_sched(core);
        true
    }

    fn sched_block_host_thread(&mut self, tid: Tid) {
        let now = self.q.now();
        let vcpus = self.hv.vcpus.len();
        let Some(st) = &mut self.sched else { return };
        let core = st.s.thread(tid).core;
        if st.s.current(core) != Some(tid) {
            return;
        }
        st.s.block(core, now);
        let canal = st.canal_of(tid);
        let kt = st.kvmtool_of(tid);
        let peer = st.peer_of(tid);
        if let Some(w) = st.io_worker(tid) {
            self.vhost_switched_out(w);
        }
        if let Some(t) = kt {
            self.kvmtool_switched_out(t);
        }
        if let Some(who) = canal {
            self.canal_switched_out(who);
        }
        if let Some((l, c)) = peer {
            self.peer_thread_switched_out(l, c);
        }
        let Some(st) = &mut self.sched else { return };
        let (_, next) = st.s.pick_next(core, now);
        self.switched_to(next, vcpus);
    }

    /// A kicked halted vCPU's thread wakes; it runs at once on an idle
    /// core, preempts per CFS, or waits its turn.
    pub(super) fn sched_wake_vcpu(&mut self, vcpu: usize) {
        if !self.hv.vcpus[vcpu].halted {
            return;
        }
        if self.is_polling(vcpu) {
            let core = self.hv.vcpus[vcpu].core;
            return self.halt_poll_success(core, vcpu);
        }
        self.hv.vcpus[vcpu].halted = false;
        self.checker.set_blocked(vcpu, false, self.q.now());
        let now = self.q.now();
        let block = now - self.halt_start[vcpu];
        self.scheme.halt_ended(vcpu, block, false);
        {
            let (mut cx, scheme) = self.cx();
            scheme.vcpu_unblocking(&mut cx, vcpu);
        }
        // The sleeping thread runs after a trip through the scheduler
        // (host.vcpu_wakeup_us): what halt polling saves.
        let lat = self.costs.vcpu_wakeup;
        self.sched_wake_thread(vcpu, lat);
    }

    /// After a deferred schedule-out on `core`: the vCPU waiting for the
    /// core comes in.
    pub(super) fn sched_after_put(&mut self, core: usize) {
        if let Some(n) = self.sched.as_mut().and_then(|st| st.switch_to[core].take()) {
            self.reschedule(n);
        }
    }

    /// Statistics restart (end of warm-up).
    pub(super) fn sched_reset(&mut self, now: Time) {
        let Some(st) = &mut self.sched else { return };
        st.deferred = 0;
        st.halts = 0;
        st.poll_time = 0;
        st.poll_success = 0;
        st.migrations = 0;
        for g in 0..st.stacked_base.len() {
            st.stacked_base[g] = st.s.stacked_time(g, now);
        }
        for v in 0..st.base.len() {
            let th = st.s.thread(v);
            st.base[v] = (st.s.waited(v, now), th.switches_in);
        }
        for i in 0..st.peer_stats_base.len() {
            let t = st.peer_base + i;
            st.peer_stats_base[i] = (st.s.thread(t).sum_exec, st.s.waited(t, now));
        }
    }

    /// The scheduler's metrics for the measured interval.
    pub(super) fn sched_metrics(&self, out: &mut Metrics, now: Time, dur_s: f64) {
        let Some(st) = &self.sched else { return };
        out.insert("host.switches_deferred".into(), st.deferred as f64);
        out.insert(
            "host.vcpu_halts_per_s".into(),
            st.halts as f64 / dur_s.max(1e-12),
        );
        // Polling is summed over every vCPU thread, so it is a share of
        // the core time of the cores vCPUs run on (interval x cores), not
        // of the interval alone: 8 VMs halt-polling on 4 cores would
        // otherwise read over 100%.
        let vcpu_cores = (0..self.hv.vcpus.len())
            .fold(crate::engine::CpuMask::EMPTY, |m, t| {
                m.union(st.s.thread(t).allowed)
            })
            .count()
            .max(1);
        out.insert(
            "host.halt_poll_pct".into(),
            100.0 * st.poll_time as f64 / (dur_s * 1e12 * vcpu_cores as f64).max(1.0),
        );
        out.insert(
            "host.halt_poll_successes_per_s".into(),
            st.poll_success as f64 / dur_s.max(1e-12),
        );
        let ps = dur_s * 1e12;
        out.insert(
            "host.vcpu_migrations_per_s".into(),
            st.migrations as f64 / dur_s.max(1e-12),
        );
        // vCPU stacking, per VM of two or more vCPUs (VM 0's by the plain
        // name): the share of the interval two of its vCPUs were runnable
        // on one core.
        for (vm, &base) in st.stacked_base.iter().enumerate() {
            if self.hv.vms[vm].vcpus.len() < 2 {
                continue;
            }
            let stacked = st.s.stacked_time(vm, now).saturating_sub(base) as f64;
            let key = format!("{}host.vcpu_stacking_pct", crate::report::vm_prefix(vm));
            out.insert(key, 100.0 * stacked / ps.max(1.0));
        }
        if !st.peer_threads.is_empty() {
            // A peer process's threads on this host, summed: their share of
            // one core's time running, and waiting in run queues.
            let (mut ran, mut waited) = (0u64, 0u64);
            for (i, &(r0, w0)) in st.peer_stats_base.iter().enumerate() {
                let t = st.peer_base + i;
                ran += st.s.thread(t).sum_exec.saturating_sub(r0);
                waited += st.s.waited(t, now).saturating_sub(w0);
            }
            out.insert(
                "host.peer_threads_cpu_pct".into(),
                100.0 * ran as f64 / ps.max(1.0),
            );
            out.insert(
                "host.peer_threads_wait_pct".into(),
                100.0 * waited as f64 / ps.max(1.0),
            );
        }
        for v in 0..st.base.len() {
            let (w0, s0) = st.base[v];
            let waited = st.s.waited(v, now).saturating_sub(w0) as f64;
            let switches = st.s.thread(v).switches_in.saturating_sub(s0) as f64;
            let p = if v == 0 {
                "host.vcpu".to_string()
            } else {
                format!("host.vcpu{v}")
            };
            out.insert(
                format!("{p}_runqueue_wait_pct"),
                100.0 * waited / ps.max(1.0),
            );
            out.insert(
                format!("{p}_switches_in_per_s"),
                switches / dur_s.max(1e-12),
            );
        }
    }
}
