//! A peer process on the VM's own host whose CPUs are host threads
//! (`host.peer_cores`): a load generator's threads that share the host's
//! cores with the vCPU and vhost threads under the host scheduler, as a
//! client on the VM's host does (DID's PV configurations reach "a host
//! process" through the bridge; docs/papers.md, DID: the memcached
//! client on the host).
//!
//! The peer's own model ([`crate::workloads::peer::PeerHost`]) plans each
//! CPU's work ahead in time (`busy_until`). Here CPU k is thread k:
//! - a frame for CPU k while its thread is off the core waits in the
//!   thread's inbox and wakes it; the peer takes it when the thread runs;
//! - while the thread runs, the peer's plan is its timeline: the thread
//!   runs until the planned work ends, then sleeps unless more came;
//! - work planned on CPU k while its thread is off the core (a timer, the
//!   output of another CPU's poll on k's connections) and work left when it
//!   was preempted are owed: when it next gets the core its plan restarts
//!   from then with what it owed. Frames that work already sent keep the
//!   times the plan gave them (the model's approximation: the peer plans
//!   a poll's output at once; a preemption in the middle of a poll moves
//!   only the work after it).

use super::event::Ev;
use super::World;
use crate::engine::Time;
use crate::hw::wire::Frame;
use std::collections::VecDeque;

/// One of a peer's CPUs as a host thread.
#[derive(Clone, Debug)]
pub(super) struct PeerThread {
    /// Its scheduler thread.
    pub(super) tid: usize,
    /// It holds its core.
    on_cpu: bool,
    /// Frames for its connections that came while it was off the core.
    inbox: VecDeque<Frame>,
    /// CPU time of planned work it has not run (off the core).
    debt: Time,
    /// The end of the plan `debt` covers: work planned beyond it is new.
    mark: Time,
    /// The current step's generation, and when it ends.
    step_gen: u32,
    step_at: Option<Time>,
}

impl PeerThread {
    fn new(tid: usize) -> Self {
        PeerThread {
            tid,
            on_cpu: false,
            inbox: VecDeque::with_capacity(64),
            debt: 0,
            mark: 0,
            step_gen: 0,
            step_at: None,
        }
    }
}

impl World {
    /// Gives every peer that runs on host threads its threads (they start
    /// asleep, off the core).
    pub(super) fn peer_threads_attach(&mut self) {
        let Some(st) = &self.sched else { return };
        for (p, link) in self.peers.iter_mut().enumerate() {
            link.threads = (0..link.peer.cpus())
                .map_while(|c| st.peer_tid(p, c).map(PeerThread::new))
                .collect();
        }
    }

    /// Frame `f` reached peer `p`: if the thread of its CPU is off the
    /// core, the frame waits for it (and wakes it). Returns whether it
    /// was held.
    pub(super) fn peer_thread_holds(&mut self, p: usize, f: Frame) -> bool {
        let Some(link) = self.peers.get_mut(p) else {
            return false;
        };
        let Some(c) = link.peer.cpu_of_frame(&f) else {
            return false;
        };
        let Some(th) = link.threads.get_mut(c) else {
            return false;
        };
        if th.on_cpu {
            return false;
        }
        th.inbox.push_back(f);
        let tid = th.tid;
        self.peer_thread_wake(tid);
        true
    }

    /// Wakes host thread `tid` unless it is runnable already. The peer's
    /// own model charges the process's wake-up (`peer.wakeup_us`) to its
    /// CPU, so the scheduler adds no latency.
    fn peer_thread_wake(&mut self, tid: usize) {
        let runnable = self
            .sched
            .as_ref()
            .is_some_and(|st| st.s.thread(tid).runnable);
        if !runnable {
            self.sched_wake_thread(tid, 0);
        }
    }

    /// After peer `p` ran: a thread on its core runs until its planned
    /// work ends (or sleeps, with none); one off the core owes what was
    /// planned on it and wakes.
    pub(super) fn peer_threads_settle(&mut self, p: usize) {
        let now = self.q.now();
        let n = self.peers.get(p).map_or(0, |l| l.threads.len());
        for c in 0..n {
            let link = &mut self.peers[p];
            let b = link.peer.busy_until(c);
            let th = &mut link.threads[c];
            if th.on_cpu {
                if b > now {
                    if th.step_at != Some(b) {
                        th.step_gen = th.step_gen.wrapping_add(1);
                        th.step_at = Some(b);
                        let ev = Ev::PeerThreadStep {
                            peer: p as u16,
                            cpu: c as u16,
                            gen: th.step_gen,
                        };
                        self.q.schedule(b, ev);
                    }
                } else if th.step_at.is_none() && th.inbox.is_empty() {
                    // Nothing planned: back to epoll_wait.
                    let tid = th.tid;
                    self.sched_block_thread(tid);
                }
                continue;
            }
            let from = th.mark.max(now);
            if b > from {
                th.debt += b - from;
                th.mark = b;
                let tid = th.tid;
                self.peer_thread_wake(tid);
            }
        }
    }

    /// Thread `c` of peer `p` finished the work planned on it, unless the
    /// step is stale.
    pub(super) fn peer_thread_step(&mut self, p: usize, c: usize, gen: u32) {
        let Some(th) = self.peers.get_mut(p).and_then(|l| l.threads.get_mut(c)) else {
            return;
        };
        if th.step_gen != gen || th.step_at.is_none() || !th.on_cpu {
            return;
        }
        th.step_at = None;
        self.peer_thread_run(p, c);
    }

    /// Where peer `p`'s timer runs: `Some(None)` (its own CPUs: the least
    /// busy), `Some(Some(c))` (thread c holds a core: the least busy such
    /// thread), or `None`: no thread holds a core, so the timer is held
    /// for the first that gets one, and the least busy thread wakes.
    pub(super) fn peer_timer_cpu(&mut self, p: usize) -> Option<Option<usize>> {
        let link = self.peers.get_mut(p)?;
        if link.threads.is_empty() {
            return Some(None);
        }
        let peer = &link.peer;
        let least_busy = |on: bool| {
            (0..link.threads.len())
                .filter(|&c| link.threads[c].on_cpu == on)
                .min_by_key(|&c| peer.busy_until(c))
        };
        if let Some(c) = least_busy(true) {
            return Some(Some(c));
        }
        let wake = least_busy(false).map(|c| link.threads[c].tid);
        link.timer_held = true;
        if let Some(tid) = wake {
            self.peer_thread_wake(tid);
        }
        None
    }

    /// Thread `c` of peer `p`, on its core: a timer held for the peer's
    /// threads runs, the peer takes the frames that waited for this one,
    /// then the thread runs what is planned or sleeps.
    fn peer_thread_run(&mut self, p: usize, c: usize) {
        let now = self.q.now();
        let link = &mut self.peers[p];
        if link.timer_held {
            link.timer_held = false;
            link.out.clear();
            link.peer.timer_on(now, Some(c), &mut link.out);
            self.peer_sent(p);
        }
        let link = &mut self.peers[p];
        if !link.threads[c].inbox.is_empty() {
            link.out.clear();
            while let Some(f) = link.threads[c].inbox.pop_front() {
                link.peer.receive(f, now, &mut link.out);
            }
            self.peer_sent(p);
        }
        self.peer_threads_settle(p);
    }

    /// Thread `c` of peer `p` got its core: what it owed restarts now.
    pub(super) fn peer_thread_switched_in(&mut self, p: usize, c: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let Some(th) = link.threads.get_mut(c) else {
            return;
        };
        th.on_cpu = true;
        if th.debt > 0 {
            link.peer.set_busy_until(c, now + th.debt);
            th.debt = 0;
        }
        self.peer_thread_run(p, c);
    }

    /// Thread `c` of peer `p` left its core (preempted, or asleep): the
    /// planned work it has not run is owed.
    pub(super) fn peer_thread_switched_out(&mut self, p: usize, c: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let b = link.peer.busy_until(c);
        let Some(th) = link.threads.get_mut(c) else {
            return;
        };
        th.on_cpu = false;
        th.step_at = None;
        th.step_gen = th.step_gen.wrapping_add(1);
        th.debt = b.saturating_sub(now);
        th.mark = b.max(now);
    }
}
