//! The virtio-blk back end DID's Fio test uses (§5.6): qemu-kvm 1.0's
//! virtio-blk over a host RAM disk, with the default `aio=threads`. Two
//! kinds of QEMU thread hand a request between them (read in the qemu-kvm
//! 1.0 tree; docs/calibration-sources.md §6):
//!
//! * the **main loop** (the I/O thread: `main_loop_wait` sleeping in
//!   `select`) is woken by the ioeventfd of the kick, pops every available
//!   request (`virtio_blk_handle_output`) and hands each to the thread pool
//!   (`paio_submit`: enqueue under a mutex, `pthread_cond_signal`);
//! * a **worker** of posix-aio-compat's pool (sleeping in
//!   `pthread_cond_timedwait`) is woken by the condition variable, does the
//!   `preadv`/`pwritev` on the RAM disk and writes one byte to a pipe
//!   (`posix_aio_notify_event`), which wakes the main loop again;
//! * the main loop reads the pipe, completes every finished request
//!   (`virtio_blk_rw_complete`: used ring, `virtio_notify`) and signals the
//!   guest if its suppression allows.
//!
//! A thread asleep when its notification arrives pays a wake-up; a thread
//! still busy sees the notification when it next looks (the main loop's
//! `select` returns at once, a worker takes the next queued request without
//! waiting). QEMU 1.0's virtio-blk never turns guest notifications off: the
//! avail-event index simply follows its pops.
//!
//! Three things the main loop shares with the rest of QEMU (docs/
//! calibration-sources.md §6):
//!
//! * **The global mutex** (`qemu_mutex_lock_iothread`): `main_loop_wait`
//!   drops it only around `select`, so a whole pass (fd handlers, timers,
//!   bottom halves) runs holding it. A vCPU thread takes it when `KVM_RUN`
//!   returns to user space (`kvm_cpu_exec`), i.e. for every exit QEMU
//!   emulates (an I/O port with no ioeventfd), and drops it before
//!   re-entering. The two serialise: a vCPU exit that finds the main loop
//!   in a pass waits for its end, and a main loop woken while a vCPU holds
//!   the mutex waits for the vCPU.
//! * **The display refresh** (`gui_update`, re-armed every
//!   `GUI_REFRESH_INTERVAL` = 30 ms of `rt_clock` while a display such as
//!   SDL is open): a main-loop timer, run after the fd handlers of its pass.
//! * **posix-aio-compat's completion walk** (`posix_aio_process_queue`):
//!   the main loop walks its list of outstanding requests (newest first),
//!   reading each one's status under the pool's mutex (`qemu_paio_error`,
//!   and `qemu_paio_return` for a finished one), completes the first
//!   finished one it finds and starts the walk again from the head.

use crate::engine::{Time, MS, SEC};
use crate::hw::virtio_blk::{BlkRequest, VirtioBlkDev};
use std::collections::{BTreeSet, VecDeque};

/// posix-aio-compat's `max_threads`.
pub const MAX_WORKERS: usize = 64;
/// A worker that waited this long for a request exits (posix-aio-compat's
/// `cond_timedwait` with a 10 s deadline).
pub const WORKER_IDLE_EXIT: Time = 10 * SEC;
/// QEMU 1.0's display refresh period (`GUI_REFRESH_INTERVAL`, console.h).
pub const GUI_REFRESH_INTERVAL: Time = 30 * MS;

/// Costs of the back end (from the calibration file).
#[derive(Clone, Copy, Debug, Default)]
pub struct BlkCosts {
    /// Waking a QEMU thread asleep in the kernel (in `select` on an
    /// eventfd or pipe, or on the pool's condition variable).
    pub wakeup: Time,
    /// Main loop, per request: pop, parse, submit to the thread pool.
    pub submit: Time,
    /// Worker, per request: the read/write system call on the RAM disk,
    /// without the copy, plus the pipe write.
    pub io: Time,
    /// RAM-disk copy per KiB (in the worker).
    pub copy_per_kib: Time,
    /// Main loop, per request: read the pipe, complete the request, push it
    /// to the used ring.
    pub complete: Time,
    /// Main loop: signalling the guest (the MSI into KVM).
    pub signal: Time,
    /// Creating a pool thread (`pthread_create`, on the main loop).
    pub thread_create: Time,
    /// One uncontended lock and unlock of the pool's mutex (each request
    /// status read in the completion walk).
    pub paio_lock: Time,
    /// One display refresh (`gui_update`: `vga_hw_update` and the
    /// display's refresh), on the main loop under the global mutex.
    pub display_refresh: Time,
}

/// Counters of the back end.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct BlkCounters {
    pub kicks: u64,
    /// Main-loop wake-ups (ioeventfd or completion pipe).
    pub main_wakeups: u64,
    /// Worker wake-ups through the condition variable.
    pub worker_wakeups: u64,
    /// Pool threads created.
    pub threads_created: u64,
    pub requests: u64,
    pub signals: u64,
    /// Display refreshes run.
    pub refreshes: u64,
    /// Status reads of the completion walk (pool-mutex lock/unlock pairs).
    pub walk_reads: u64,
    /// vCPU exits that found the main loop holding the global mutex, and
    /// their total wait.
    pub vcpu_mutex_waits: u64,
    pub vcpu_mutex_wait: Time,
    /// Main-loop passes that found a vCPU holding the global mutex.
    pub main_mutex_waits: u64,
}

/// What the main loop is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Main {
    /// Asleep in `select`.
    Asleep,
    /// Woken, not yet running.
    Waking,
    /// Running one unit of work.
    Busy,
}

/// One unit of the main loop's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// `virtio_blk_handle_output`: pop the next request and submit it.
    Pop,
    /// Submitting popped request `head` to the pool.
    Submit(u16, BlkRequest),
    /// Completing request `head` (from the pipe's queue), after `reads`
    /// status reads of the walk that found it.
    Complete(u16, u32),
    /// The display refresh timer's callback.
    Refresh,
    /// The MSI into KVM after a completion.
    Signal,
    /// Creating a pool thread (the new-thread bottom half).
    Spawn,
}

/// A pool thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Worker {
    /// Waiting on the condition variable since the given time.
    Idle(Time),
    /// Woken by `pthread_cond_signal`, not yet running.
    Waking,
    /// Doing request `head`.
    Busy(u16),
    /// Exited after its timed wait ran out (the slot may be reused).
    Exited,
}

/// Something due at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// The main loop runs (after a wake-up, or its unit ended).
    Main,
    /// Worker `w` runs (after a wake-up or creation).
    WorkerRuns(usize),
    /// Worker `w` finished its request.
    WorkerDone(usize),
    /// The display refresh timer expires.
    Refresh,
}

/// What a step of the back end asks of the platform.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOut {
    /// The guest's completion interrupt is to be raised now.
    pub signal: bool,
}

/// The RAM-disk back end of one virtio-blk device.
#[derive(Clone, Debug)]
pub struct RamDiskBackend {
    /// The VM it serves.
    pub vm: usize,
    /// Ioeventfd of the request queue.
    pub kick_fd: u16,
    /// The guest's MSI-X vector for the request queue.
    pub vector: u8,
    /// RAM-disk size in bytes (requests beyond it fail the model's check).
    pub capacity: u64,
    main: Main,
    /// Units the main loop still has to do in this pass.
    units: VecDeque<Unit>,
    /// The unit the main loop is running.
    current: Option<Unit>,
    /// The ioeventfd is readable.
    kick_ready: bool,
    /// The completion pipe is readable.
    pipe_ready: bool,
    /// Requests queued for the pool (`request_list`).
    request_list: VecDeque<(u16, BlkRequest)>,
    /// Requests a worker finished, for the main loop.
    finished: VecDeque<u16>,
    /// posix-aio-compat's `first_aio`: requests submitted and not yet
    /// completed, newest first.
    first_aio: VecDeque<u16>,
    /// When the running unit ends.
    current_end: Time,
    /// The display refresh timer has expired; its callback runs in the
    /// next pass.
    refresh_due: bool,
    /// A vCPU holds the global mutex until then (or waits for it and then
    /// holds it).
    vcpu_until: Time,
    /// Pool threads that are being created.
    spawning: usize,
    workers: Vec<Worker>,
    /// What is due when: (time, order of arrival, what).
    agenda: BTreeSet<(Time, u64, Due)>,
    seq: u64,
    /// Requests past the end of the disk.
    pub out_of_range: u64,
    /// Counters.
    pub counters: BlkCounters,
}

impl RamDiskBackend {
    /// A back end for `vm` over a RAM disk of `capacity` bytes; `display`:
    /// QEMU has a display open whose refresh timer runs on the main loop
    /// (first at time 0, as `gui_update` is armed at start-up).
    pub fn new(vm: usize, kick_fd: u16, vector: u8, capacity: u64, display: bool) -> Self {
        let mut b = RamDiskBackend {
            vm,
            kick_fd,
            vector,
            capacity,
            main: Main::Asleep,
            units: VecDeque::new(),
            current: None,
            kick_ready: false,
            pipe_ready: false,
            request_list: VecDeque::new(),
            finished: VecDeque::new(),
            first_aio: VecDeque::new(),
            current_end: 0,
            refresh_due: false,
            vcpu_until: 0,
            spawning: 0,
            workers: Vec::new(),
            agenda: BTreeSet::new(),
            seq: 0,
            out_of_range: 0,
            counters: BlkCounters::default(),
        };
        if display {
            b.at(0, Due::Refresh);
        }
        b
    }

    /// The earliest time something is due (for the platform's timer).
    pub fn next_due(&self) -> Option<Time> {
        self.agenda.iter().next().map(|e| e.0)
    }

    /// Pool threads alive.
    pub fn threads(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| **w != Worker::Exited)
            .count()
    }

    fn at(&mut self, t: Time, d: Due) {
        self.seq += 1;
        self.agenda.insert((t, self.seq, d));
    }

    /// A file descriptor of the main loop became readable.
    fn main_notify(&mut self, now: Time, c: &BlkCosts) {
        if self.main == Main::Asleep {
            self.main = Main::Waking;
            self.counters.main_wakeups += 1;
            self.at(now + c.wakeup, Due::Main);
        }
    }

    /// An eventfd fired: true if it is this device's kick.
    pub fn kick(&mut self, fd: u16, now: Time, c: &BlkCosts) -> bool {
        if fd != self.kick_fd {
            return false;
        }
        self.counters.kicks += 1;
        self.kick_ready = true;
        self.main_notify(now, c);
        true
    }

    /// A vCPU thread of this VM returns to user space at `now` for an exit
    /// QEMU emulates, which holds the global mutex for `hold`: returns how
    /// long it waits for the mutex first. A main loop in a pass keeps the
    /// mutex to the pass's end (its running unit and those queued; work
    /// the pass adds later is not waited for).
    pub fn vcpu_lock(&mut self, now: Time, hold: Time, c: &BlkCosts) -> Time {
        let free_at = match self.main {
            Main::Busy => {
                let queued: Time = self.units.iter().map(|&u| Self::unit_cost(u, c)).sum();
                self.current_end + queued
            }
            // A woken main loop that has not taken the mutex yet, or one
            // asleep in select: the vCPU takes it (after another vCPU's
            // hold, with one vCPU thread per VM in the model never).
            Main::Waking | Main::Asleep => now,
        }
        .max(self.vcpu_until)
        .max(now);
        let wait = free_at - now;
        if wait > 0 {
            self.counters.vcpu_mutex_waits += 1;
            self.counters.vcpu_mutex_wait += wait;
        }
        self.vcpu_until = free_at + hold;
        wait
    }

    /// The main loop's cost for unit `u`.
    fn unit_cost(u: Unit, c: &BlkCosts) -> Time {
        match u {
            Unit::Pop => 0,
            Unit::Submit(..) => c.submit,
            Unit::Complete(_, reads) => c.complete + Time::from(reads) * c.paio_lock,
            Unit::Signal => c.signal,
            Unit::Spawn => c.thread_create,
            Unit::Refresh => c.display_refresh,
        }
    }

    /// Runs everything due up to `now`.
    pub fn step(&mut self, now: Time, dev: &mut VirtioBlkDev, c: &BlkCosts) -> StepOut {
        let mut out = StepOut::default();
        while let Some(&(t, s, d)) = self.agenda.iter().next() {
            if t > now {
                break;
            }
            self.agenda.remove(&(t, s, d));
            match d {
                Due::Main if self.main == Main::Waking && t < self.vcpu_until => {
                    // Back from select, blocked on the global mutex a vCPU
                    // holds: woken again when it drops it.
                    self.counters.main_mutex_waits += 1;
                    self.at(self.vcpu_until + c.wakeup, Due::Main);
                }
                Due::Main => {
                    if let Some(u) = self.current.take() {
                        self.unit_done(u, t, dev, c, &mut out);
                    }
                    self.main_next(t, dev, c);
                }
                Due::Refresh => {
                    // The timer runs in the main loop's next pass, after
                    // its fd handlers (`qemu_run_all_timers`); a sleeping
                    // loop's select times out (a wake-up like any other).
                    self.refresh_due = true;
                    if self.main == Main::Asleep {
                        self.main = Main::Waking;
                        self.at(t + c.wakeup, Due::Main);
                    }
                }
                Due::WorkerRuns(w) => self.worker_next(w, t, c),
                Due::WorkerDone(w) => {
                    if let Worker::Busy(head) = self.workers[w] {
                        self.finished.push_back(head);
                    }
                    // posix_aio_notify_event: one byte into the pipe.
                    self.pipe_ready = true;
                    self.main_notify(t, c);
                    self.worker_next(w, t, c);
                }
            }
        }
        out
    }

    /// The effect of a unit of the main loop at its end.
    fn unit_done(
        &mut self,
        u: Unit,
        now: Time,
        dev: &mut VirtioBlkDev,
        c: &BlkCosts,
        out: &mut StepOut,
    ) {
        match u {
            Unit::Pop => {}
            Unit::Submit(head, r) => self.paio_submit(head, r, now, c),
            Unit::Refresh => {
                // gui_update re-arms its timer an interval after it ran.
                self.counters.refreshes += 1;
                self.at(now + GUI_REFRESH_INTERVAL, Due::Refresh);
            }
            Unit::Complete(head, _) => {
                dev.complete(head);
                if dev.need_signal() {
                    self.units.push_front(Unit::Signal);
                }
            }
            Unit::Signal => {
                // The interrupt is in KVM when the call returns.
                self.counters.signals += 1;
                out.signal = true;
            }
            Unit::Spawn => {
                self.spawning -= 1;
                self.counters.threads_created += 1;
                let w = match self.workers.iter().position(|w| *w == Worker::Exited) {
                    Some(w) => w,
                    None => {
                        self.workers.push(Worker::Exited);
                        self.workers.len() - 1
                    }
                };
                // The new thread starts running and looks at the queue.
                self.worker_next(w, now, c);
            }
        }
    }

    /// The main loop picks its next unit, or goes back to `select`.
    fn main_next(&mut self, now: Time, dev: &mut VirtioBlkDev, c: &BlkCosts) {
        loop {
            if let Some(u) = self.units.pop_front() {
                let cost = match u {
                    Unit::Pop => {
                        // virtqueue_pop until the ring is empty.
                        match dev.pop() {
                            Some((head, r)) => {
                                self.counters.requests += 1;
                                if r.sector * 512 + r.len as u64 > self.capacity {
                                    self.out_of_range += 1;
                                }
                                self.units.push_front(Unit::Pop);
                                self.units.push_front(Unit::Submit(head, r));
                            }
                            None => {
                                // The avail-event index follows the pops;
                                // a request published meanwhile is popped.
                                if dev.enable_notify() {
                                    self.units.push_front(Unit::Pop);
                                }
                            }
                        }
                        continue;
                    }
                    u => Self::unit_cost(u, c),
                };
                self.current = Some(u);
                self.main = Main::Busy;
                self.current_end = now + cost;
                self.at(now + cost, Due::Main);
                return;
            }
            // The pass is over: the mutex is dropped around select. A vCPU
            // waiting for it (or holding it) goes first; select returns at
            // once for what is already readable, and the loop then blocks
            // on the mutex until the vCPU drops it.
            if self.vcpu_until > now {
                self.main = if self.pipe_ready || self.kick_ready || self.refresh_due {
                    self.counters.main_mutex_waits += 1;
                    self.at(self.vcpu_until + c.wakeup, Due::Main);
                    Main::Waking
                } else {
                    Main::Asleep
                };
                return;
            }
            if self.pipe_ready {
                self.pipe_ready = false;
                self.completion_walk();
            }
            if self.kick_ready {
                self.kick_ready = false;
                self.units.push_back(Unit::Pop);
            }
            if self.refresh_due {
                self.refresh_due = false;
                self.units.push_back(Unit::Refresh);
            }
            if self.units.is_empty() {
                self.main = Main::Asleep;
                return;
            }
        }
    }

    /// `posix_aio_process_queue` after the pipe was read: walk the
    /// outstanding requests from the newest, one status read each (two for
    /// a finished one: `qemu_paio_error` then `qemu_paio_return`); complete
    /// the first finished one and walk again from the head; a last walk
    /// finds none. The reads are charged to the completions they found
    /// (the last walk's to the last one).
    fn completion_walk(&mut self) {
        let first = self.units.len();
        while !self.finished.is_empty() {
            let mut reads = 0u32;
            let found = self.first_aio.iter().position(|h| {
                reads += 1;
                self.finished.contains(h)
            });
            let Some(i) = found else {
                // Finished but not on the list (cannot happen): dropped.
                self.finished.clear();
                break;
            };
            let head = self.first_aio.remove(i).unwrap_or_default();
            self.finished.retain(|&h| h != head);
            self.units.push_back(Unit::Complete(head, reads + 1));
        }
        let last_walk = self.first_aio.len() as u32;
        self.counters.walk_reads +=
            self.units
                .iter()
                .skip(first)
                .fold(u64::from(last_walk), |n, u| match u {
                    Unit::Complete(_, r) => n + u64::from(*r),
                    _ => n,
                });
        if let Some(Unit::Complete(_, r)) = self.units.back_mut() {
            *r += last_walk;
        }
    }

    /// `paio_submit`: a new thread if none is idle, the request on the
    /// list, one waiter signalled.
    fn paio_submit(&mut self, head: u16, r: BlkRequest, now: Time, c: &BlkCosts) {
        // The AIOCB goes on the head of `first_aio`.
        self.first_aio.push_front(head);
        // Threads whose timed wait ran out have exited.
        for w in &mut self.workers {
            if matches!(*w, Worker::Idle(since) if now >= since + WORKER_IDLE_EXIT) {
                *w = Worker::Exited;
            }
        }
        let idle = self
            .workers
            .iter()
            .filter(|w| matches!(w, Worker::Idle(_) | Worker::Waking))
            .count();
        if idle == 0 && self.threads() + self.spawning < MAX_WORKERS {
            // spawn_thread: the new-thread bottom half runs on the main
            // loop after the current work.
            self.spawning += 1;
            self.units.push_back(Unit::Spawn);
        }
        self.request_list.push_back((head, r));
        // pthread_cond_signal wakes one waiting thread, if any waits.
        if let Some(w) = self
            .workers
            .iter()
            .position(|w| matches!(w, Worker::Idle(_)))
        {
            self.workers[w] = Worker::Waking;
            self.counters.worker_wakeups += 1;
            self.at(now + c.wakeup, Due::WorkerRuns(w));
        }
    }

    /// Worker `w` is running: it takes the next queued request or waits.
    fn worker_next(&mut self, w: usize, now: Time, c: &BlkCosts) {
        match self.request_list.pop_front() {
            Some((head, r)) => {
                self.workers[w] = Worker::Busy(head);
                let cost = c.io + c.copy_per_kib * r.len as Time / 1024;
                self.at(now + cost, Due::WorkerDone(w));
            }
            None => self.workers[w] = Worker::Idle(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::from_us;

    fn costs() -> BlkCosts {
        BlkCosts {
            wakeup: from_us(3.0),
            submit: from_us(1.5),
            io: from_us(1.5),
            copy_per_kib: 0,
            complete: from_us(1.0),
            signal: from_us(0.3),
            thread_create: from_us(30.0),
            paio_lock: 0,
            display_refresh: from_us(50.0),
        }
    }

    /// Drives the back end alone: requests at `issue` times (queue depth
    /// 1 unless the previous one is still out), returns completion times.
    fn serve(b: &mut RamDiskBackend, dev: &mut VirtioBlkDev, n: usize) -> Vec<Time> {
        let c = costs();
        let mut now = 0;
        let mut done = Vec::new();
        for i in 0..n {
            let r = BlkRequest {
                write: i % 2 == 0,
                sector: i as u64 * 8,
                len: 4096,
                issued: now,
            };
            assert!(dev.add(r));
            if dev.kick_prepare() {
                b.kick(7, now, &c);
            }
            loop {
                let t = b.next_due().expect("the request is under way");
                now = t;
                if b.step(now, dev, &c).signal {
                    while dev.get_done().is_some() {}
                    dev.enable_cb();
                    done.push(now);
                    break;
                }
            }
            // The guest thinks before the next request; the threads sleep.
            now += from_us(50.0);
            while b.next_due().is_some_and(|t| t <= now) {
                b.step(b.next_due().unwrap(), dev, &c);
            }
        }
        done
    }

    #[test]
    fn each_request_crosses_three_thread_hand_offs() {
        let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        let done = serve(&mut b, &mut dev, 20);
        assert_eq!(done.len(), 20);
        // One pool thread, created for the first request only.
        assert_eq!(b.counters.threads_created, 1);
        assert_eq!(b.threads(), 1);
        // Every request wakes the main loop twice (kick, pipe) and, after
        // the first, the sleeping worker once.
        assert_eq!(b.counters.main_wakeups, 40);
        assert_eq!(b.counters.worker_wakeups, 19);
        assert_eq!(b.counters.requests, 20);
        assert_eq!(b.counters.signals, 20);
    }

    #[test]
    fn service_time_is_three_wakeups_plus_the_threads_work() {
        let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        let c = costs();
        // Warm the pool (the first request creates the thread).
        serve(&mut b, &mut dev, 1);
        let start = SEC;
        let r = BlkRequest {
            write: false,
            sector: 0,
            len: 4096,
            issued: start,
        };
        dev.add(r);
        assert!(dev.kick_prepare());
        b.kick(7, start, &c);
        let now = loop {
            let now = b.next_due().unwrap();
            if b.step(now, &mut dev, &c).signal {
                break now;
            }
        };
        let want = 3 * c.wakeup + c.submit + c.io + c.complete + c.signal;
        assert_eq!(now - start, want);
    }

    #[test]
    fn a_busy_main_loop_sees_the_pipe_without_a_wakeup() {
        // The worker finishes while the main loop still runs (a long
        // submit): the pipe is read on the loop's next pass, no wake-up.
        let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        serve(&mut b, &mut dev, 1);
        let mut c = costs();
        c.io = 0;
        c.wakeup = from_us(1.0);
        // Two requests in one kick: the worker's first completion lands
        // while the main loop submits the second.
        let t0 = SEC;
        for i in 0..2u64 {
            dev.add(BlkRequest {
                write: false,
                sector: i * 8,
                len: 4096,
                issued: t0,
            });
        }
        assert!(dev.kick_prepare());
        let before = b.counters.main_wakeups;
        b.kick(7, t0, &c);
        let mut signals = 0;
        while let Some(t) = b.next_due() {
            if b.step(t, &mut dev, &c).signal {
                signals += 1;
            }
        }
        assert_eq!(b.counters.requests, 3);
        assert!(signals >= 1);
        // The kick woke the main loop; at least one completion found it
        // busy (fewer than one wake-up per completion).
        let wakeups = b.counters.main_wakeups - before;
        assert!(wakeups < 3, "{wakeups}");
        while dev.get_done().is_some() {}
    }

    /// Runs the back end from `t0` until it signals; returns that time.
    fn until_signal(b: &mut RamDiskBackend, dev: &mut VirtioBlkDev, c: &BlkCosts) -> Time {
        loop {
            let t = b.next_due().expect("the request is under way");
            if b.step(t, dev, c).signal {
                while dev.get_done().is_some() {}
                dev.enable_cb();
                return t;
            }
        }
    }

    fn one_request(dev: &mut VirtioBlkDev, at: Time) {
        assert!(dev.add(BlkRequest {
            write: false,
            sector: 0,
            len: 4096,
            issued: at,
        }));
        assert!(dev.kick_prepare());
    }

    #[test]
    fn the_completion_walk_reads_every_outstanding_request() {
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        // Newest first: 3, 2, 1, 0; requests 1 and 3 have finished.
        b.first_aio.extend([3, 2, 1, 0]);
        b.finished.extend([1, 3]);
        b.completion_walk();
        // Walk 1 reads 3 (finished, read twice); walk 2 reads 2, then 1
        // (twice); the last walk reads 2 and 0 and finds nothing.
        let done: Vec<Unit> = b.units.iter().copied().collect();
        assert_eq!(done, [Unit::Complete(3, 2), Unit::Complete(1, 3 + 2)]);
        assert_eq!(b.counters.walk_reads, 7);
        assert_eq!(b.first_aio, [2, 0]);
        assert!(b.finished.is_empty());
    }

    #[test]
    fn a_display_refresh_holds_the_main_loop_off_a_kick() {
        let c = costs();
        let kick_at = from_us(10.0);
        let served = |display: bool| {
            let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
            let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, display);
            // A pool thread already waits (as after the first request).
            b.workers.push(Worker::Idle(0));
            // The refresh timer fires at 0: the loop wakes and runs it.
            while b.next_due().is_some_and(|t| t < kick_at) {
                b.step(b.next_due().unwrap(), &mut dev, &c);
            }
            one_request(&mut dev, kick_at);
            b.kick(7, kick_at, &c);
            let t = until_signal(&mut b, &mut dev, &c);
            (t, b)
        };
        let (with, b) = served(true);
        let (without, _) = served(false);
        // The kick came 7 us into the 50 us refresh (woken at 3 us): the
        // request waits for its end instead of paying a wake-up.
        let refresh_end = c.wakeup + c.display_refresh;
        assert_eq!(with - without, refresh_end - kick_at - c.wakeup);
        assert_eq!(b.counters.refreshes, 1);
        // The timer is re-armed 30 ms after the refresh ran.
        assert_eq!(b.next_due(), Some(refresh_end + GUI_REFRESH_INTERVAL));
    }

    #[test]
    fn a_vcpu_exit_and_the_main_loop_serialise_on_the_global_mutex() {
        let c = costs();
        let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        serve(&mut b, &mut dev, 1);
        let t0 = SEC;
        one_request(&mut dev, t0);
        b.kick(7, t0, &c);
        // The main loop wakes (3 us) and submits (1.5 us).
        b.step(t0 + c.wakeup, &mut dev, &c);
        assert_eq!(b.main, Main::Busy);
        // A vCPU exits to user space 1 us into the submit: it waits for
        // the rest of the pass, then holds the mutex 8 us.
        let exit_at = t0 + c.wakeup + from_us(1.0);
        let wait = b.vcpu_lock(exit_at, from_us(8.0), &c);
        assert_eq!(wait, c.submit - from_us(1.0));
        assert_eq!(b.counters.vcpu_mutex_waits, 1);
        // The worker's completion (pipe) wakes the loop while the vCPU
        // holds the mutex: it blocks, and is woken again when it is free.
        let t = until_signal(&mut b, &mut dev, &c);
        assert_eq!(b.counters.main_mutex_waits, 1);
        let vcpu_done = exit_at + wait + from_us(8.0);
        assert_eq!(t, vcpu_done + c.wakeup + c.complete + c.signal);
        // A main loop asleep lets the vCPU in at once.
        assert_eq!(b.vcpu_lock(t + SEC, from_us(8.0), &c), 0);
    }

    #[test]
    fn the_pool_grows_when_no_thread_is_idle_and_idle_threads_exit() {
        let c = costs();
        let mut dev = VirtioBlkDev::new(128, true, 0).unwrap();
        let mut b = RamDiskBackend::new(0, 7, 0x53, 1 << 30, false);
        for i in 0..4u64 {
            dev.add(BlkRequest {
                write: true,
                sector: i * 8,
                len: 4096,
                issued: 0,
            });
        }
        assert!(dev.kick_prepare());
        b.kick(7, 0, &c);
        while let Some(t) = b.next_due() {
            b.step(t, &mut dev, &c);
        }
        // Four requests submitted back to back with no idle thread: four
        // threads (each submit saw none idle).
        assert_eq!(b.counters.threads_created, 4);
        assert_eq!(b.counters.requests, 4);
        // Eleven seconds later the idle threads have exited; a request
        // creates a thread again.
        let t = 11 * SEC;
        dev.add(BlkRequest {
            write: false,
            sector: 0,
            len: 512,
            issued: t,
        });
        dev.kick_prepare();
        b.kick(7, t, &c);
        while let Some(t) = b.next_due() {
            b.step(t, &mut dev, &c);
        }
        assert_eq!(b.counters.threads_created, 5);
        assert_eq!(b.threads(), 1);
    }
}
