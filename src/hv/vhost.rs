//! vhost-net: the in-kernel back end of virtio-net devices
//! (`drivers/vhost/net.c` and `vhost.c` in spirit), and the worker threads
//! that run it.
//!
//! A device has two **handlers**, one per virtqueue:
//!
//! * **TX** (`handle_tx`): queued by the guest's kick through an ioeventfd;
//!   with guest notifications disabled it takes every available buffer,
//!   hands the frame to the tap device (and so the bridge), returns the
//!   buffer to the used ring, and signals the guest only if it asked
//!   (`vhost_signal` → irqfd). When the ring is empty it re-enables
//!   notifications and looks once more, so a kick is never lost.
//! * **RX** (`handle_rx`): queued when the tap socket has frames; copies
//!   each into the next available guest buffer, adds it to the used ring
//!   and signals through the irqfd if the guest's suppression allows. Out
//!   of guest buffers, it re-enables notifications and waits for the
//!   guest's refill kick.
//!
//! A **worker** thread (`vhost_worker`) runs the handlers queued on its
//! work list in FIFO order (`vhost_work_queue` never queues one twice). A
//! handler's turn ends when its ring is empty or after `VHOST_NET_WEIGHT`
//! bytes, when it requeues itself at the tail (`vhost_poll_queue`), so one
//! queue cannot starve the others. The worker sleeps when the list is
//! empty; waking it costs a wake-up latency. Stock vhost has one worker per
//! device; ES2's *joint* threads serve several devices (docs/papers.md,
//! ES2 §2.4), with the hybrid polling policies of [`Hybrid`].
//!
//! The back end raises the guest's interrupt through the scheme's
//! `virtual_interrupt` (irqfd → `kvm_set_irq`), so KVM injects it, APICv
//! posts it and DID sends it as an IPI (DID §4.3).

use crate::engine::Time;
use crate::hw::virtio_net::VirtioNetDev;
use crate::hw::wire::Frame;
use std::collections::VecDeque;

/// `VHOST_NET_WEIGHT`: bytes one handler run may move before requeueing.
pub const VHOST_NET_WEIGHT: u64 = 0x80000;

/// Costs of the back end (from the calibration file).
#[derive(Clone, Copy, Debug, Default)]
pub struct VhostCosts {
    /// A sleeping worker woken by an eventfd or socket callback until it runs.
    pub wakeup: Time,
    /// `handle_tx` per frame: descriptor, copy into an skb, tap + bridge.
    pub tx_per_frame: Time,
    /// `handle_rx` per frame: tap recvmsg, copy into the guest buffer.
    pub rx_per_frame: Time,
    /// Copy per KiB of a GSO packet beyond its first MTU-sized frame
    /// (the per-frame costs cover one MTU's copy).
    pub copy_per_kib: Time,
    /// `vhost_signal` → eventfd → irqfd injection request.
    pub signal: Time,
    /// One look at a ring that finds nothing new: one iteration of a
    /// polling worker's loop (how soon it sees new work), or a polling
    /// handler's empty turn.
    pub poll_iteration: Time,
}

/// The largest plain frame (1500-byte MTU plus the Ethernet header): the
/// copy the per-frame costs include.
const MTU_FRAME: u32 = 1514;

impl VhostCosts {
    /// The copy a GSO packet `f` needs beyond one MTU-sized frame.
    pub fn gso_copy(&self, f: &Frame) -> Time {
        let beyond = u64::from(f.len().saturating_sub(MTU_FRAME));
        self.copy_per_kib * beyond / 1024
    }

    /// How long new work waits before the worker acts on it.
    pub fn start_latency(&self, polling: bool) -> Time {
        if polling {
            self.poll_iteration
        } else {
            self.wakeup
        }
    }
}

/// A device's virtqueue, as a handler serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vq {
    /// The receive queue (queue 0).
    Rx = 0,
    /// The transmit queue (queue 1).
    Tx = 1,
}

/// One handler on a worker's list: device `dev`'s handler for `vq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handler {
    /// Index of the device among the machine's vhost-net devices.
    pub dev: u16,
    /// Which queue.
    pub vq: Vq,
    /// Queued speculatively (ES2's optimistic polling handler) rather than
    /// for real work.
    pub polling: bool,
}

/// How a worker switches its TX handlers between notification and polling
/// (ES2 §5.2–5.3, docs/papers.md ES2 §2.5–2.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Hybrid {
    /// Stock vhost: kicks are suppressed only while a handler runs.
    #[default]
    Off,
    /// Perceptive (Algorithm 1): a TX turn that takes `quota` requests
    /// before the ring empties stays in polling mode (kicks off) and
    /// requeues at the tail; a ring that empties first turns kicks back on.
    Perceptive {
        /// Requests per turn before requeueing.
        quota: u32,
    },
    /// Optimistic (Algorithm 2): each new ingress packet placed for the
    /// guest turns the VM's TX kicks off and queues its TX handler as a
    /// polling handler, which looks at the ring once per turn until
    /// `max_poll_count` turns have passed since the last ingress packet.
    Optimistic {
        /// Turns a polling handler keeps polling after the last packet.
        max_poll_count: u32,
    },
}

/// A unit of work the worker has started and finishes after its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// TX buffer `head` of device `dev` holds frame `f`, being sent to the tap.
    Tx {
        /// Device.
        dev: u16,
        /// Descriptor head.
        head: u16,
        /// The frame.
        f: Frame,
    },
    /// Frame `f` from the tap is being copied into RX buffer `head`.
    Rx {
        /// Device.
        dev: u16,
        /// Descriptor head.
        head: u16,
        /// The frame.
        f: Frame,
    },
}

/// What finishing a unit of work did, for the platform to carry out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// A frame device `.0` sent, now on the bridge.
    pub to_bridge: Option<(u16, Frame)>,
    /// Raise device `.0`'s interrupt for queue `.1` (irqfd).
    pub signal: Option<(u16, usize)>,
    /// Worker time the signal took (delays the next unit).
    pub extra: Time,
}

/// What the worker does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A unit of work that takes this long.
    Unit(Time),
    /// Nothing queued: the thread sleeps until work is queued.
    Sleep,
    /// ES2's interruptible sleep (10 µs): only polling or quota-bound
    /// handlers remain; new work ends it early.
    Nap,
}

/// Counters of one vhost-net device.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct VhostCounters {
    pub kicks: u64,
    /// Kicks of the TX queue alone (the guest's `virtqueue_kick` after
    /// `start_xmit`, when its publication crossed `avail_event`).
    pub tx_kicks: u64,
    /// Times `handle_tx` found the ring empty and re-enabled kicks
    /// (`vhost_enable_notify`): each is the point after which the
    /// driver's next added frame kicks.
    pub tx_notify_enables: u64,
    /// Of those, the re-checks that found frames added meanwhile (no kick
    /// was coming for them; the handler disabled kicks again and went on).
    pub tx_slipped_in: u64,
    pub wakeups: u64,
    pub tx_frames: u64,
    pub rx_frames: u64,
    pub signals: u64,
    pub signals_suppressed: u64,
    pub tap_drops: u64,
    pub rx_no_buffer: u64,
    /// TX turns that ended at the quota in polling mode (perceptive).
    pub quota_requeues: u64,
    /// Turns of a polling TX handler (optimistic), and those that found
    /// the ring empty.
    pub polling_turns: u64,
    pub empty_polls: u64,
}

/// The back end of one virtio-net device.
#[derive(Clone, Debug)]
pub struct VhostNet {
    /// The VM it serves.
    pub vm: usize,
    /// The virtio-net device index on the machine.
    pub dev: usize,
    /// Its worker thread.
    pub worker: usize,
    /// Ioeventfd the guest's RX and TX queue notifies signal, per queue.
    pub kick_fd: [u16; 2],
    /// The tap socket's receive queue: frames from the bridge for the guest.
    pub tap: VecDeque<Frame>,
    /// Its capacity (`tx_queue_len`-like; further frames are dropped).
    pub tap_capacity: usize,
    /// Each handler is on its worker's scheduling list (RX, TX).
    queued: [bool; 2],
    /// Each handler is on its worker's polling list.
    parked: [bool; 2],
    /// ES2 optimistic: the TX handler is a polling handler (`is_poll`), and
    /// its turns since the last ingress packet (`poll_count`).
    is_poll: bool,
    poll_count: u32,
    /// ELVIS side-core mode: the worker polls the virtqueues from its
    /// dedicated core; guest notifications stay disabled for good and the
    /// platform tells the worker about new buffers after one poll
    /// iteration.
    pub polling: bool,
    /// Avail index of each queue (RX, TX) when the poller last looked.
    pub polled_avail: [u16; 2],
    /// Counters.
    pub counters: VhostCounters,
}

impl VhostNet {
    /// The back end of device `dev` of `vm`, run by worker `worker`.
    pub fn new(
        vm: usize,
        dev: usize,
        worker: usize,
        kick_fd: [u16; 2],
        tap_capacity: usize,
    ) -> Self {
        VhostNet {
            vm,
            dev,
            worker,
            kick_fd,
            tap: VecDeque::with_capacity(tap_capacity),
            tap_capacity,
            queued: [false; 2],
            parked: [false; 2],
            is_poll: false,
            poll_count: 0,
            polling: false,
            polled_avail: [0; 2],
            counters: VhostCounters::default(),
        }
    }

    /// Which handler eventfd `fd` queues, if it is one of this device's
    /// kicks.
    pub fn kicked(&mut self, fd: u16) -> Option<Vq> {
        let q = self.kick_fd.iter().position(|&k| k == fd)?;
        self.counters.kicks += 1;
        if q == 0 {
            Some(Vq::Rx)
        } else {
            self.counters.tx_kicks += 1;
            Some(Vq::Tx)
        }
    }

    /// A frame arrived on the tap socket (from the bridge). Returns true if
    /// it was queued (RX has work), false if the socket was full.
    pub fn tap_receive(&mut self, f: Frame) -> bool {
        if self.tap.len() >= self.tap_capacity {
            self.counters.tap_drops += 1;
            return false;
        }
        self.tap.push_back(f);
        true
    }

    /// The poller looked at the rings: which handlers have new work.
    pub fn poll_rings(&mut self, vq: &VirtioNetDev) -> [bool; 2] {
        let avail = [vq.rx_ring().avail_idx, vq.tx_ring().avail_idx];
        let tx = avail[1] != self.polled_avail[1];
        let rx = avail[0] != self.polled_avail[0] && !self.tap.is_empty();
        self.polled_avail = avail;
        [rx, tx]
    }

    fn signal_if(&mut self, need: bool, queue: usize) -> Option<(u16, usize)> {
        if need {
            self.counters.signals += 1;
            Some((self.dev as u16, queue))
        } else {
            self.counters.signals_suppressed += 1;
            None
        }
    }
}

/// The handler a worker is running and what its turn has done so far.
#[derive(Clone, Copy, Debug)]
struct Turn {
    h: Handler,
    /// Bytes moved this turn (against `VHOST_NET_WEIGHT`).
    bytes: u64,
    /// Requests taken this turn (ES2's `load`).
    load: u32,
}

/// Counters of one worker thread.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct WorkerCounters {
    pub wakeups: u64,
    pub naps: u64,
    /// Time spent running units (CPU the thread used, wake-ups excluded).
    pub busy: Time,
}

/// A vhost worker thread: its work list and the handler it runs.
#[derive(Clone, Debug)]
pub struct VhostWorker {
    /// Host core it is pinned to.
    pub core: usize,
    /// Its hybrid polling policy.
    pub hybrid: Hybrid,
    /// The scheduling list (`work_list`): handlers with work, FIFO.
    list: VecDeque<Handler>,
    /// ES2 §5.3: polling handlers that need another turn once the worker
    /// has gone round its list (or slept).
    polling_list: VecDeque<Handler>,
    turn: Option<Turn>,
    inflight: Option<InFlight>,
    /// Awake: running a unit, or about to (not asleep, not napping).
    pub running: bool,
    /// In ES2's interruptible sleep.
    pub napping: bool,
    /// Counters.
    pub counters: WorkerCounters,
}

impl VhostWorker {
    /// An idle worker on `core`.
    pub fn new(core: usize, hybrid: Hybrid) -> Self {
        VhostWorker {
            core,
            hybrid,
            list: VecDeque::with_capacity(16),
            polling_list: VecDeque::with_capacity(16),
            turn: None,
            inflight: None,
            running: false,
            napping: false,
            counters: WorkerCounters::default(),
        }
    }

    /// `vhost_work_queue`: device `d`'s handler for `vq` has work. Returns
    /// true if the worker must be woken (asleep or napping).
    pub fn queue(&mut self, d: &mut VhostNet, vq: Vq) -> bool {
        self.enqueue(d, vq, false);
        self.wake()
    }

    fn enqueue(&mut self, d: &mut VhostNet, vq: Vq, polling: bool) {
        let q = vq as usize;
        if d.queued[q] {
            if !polling {
                // Real work for a handler queued speculatively.
                if let Some(h) = self
                    .list
                    .iter_mut()
                    .find(|h| h.dev == d.dev as u16 && h.vq == vq)
                {
                    h.polling = false;
                }
            }
            return;
        }
        let running = self
            .turn
            .is_some_and(|t| t.h.dev == d.dev as u16 && t.h.vq == vq);
        if running && polling {
            // The running turn will look at the ring anyway.
            return;
        }
        if d.parked[q] {
            d.parked[q] = false;
            self.polling_list
                .retain(|h| !(h.dev == d.dev as u16 && h.vq == vq));
        }
        d.queued[q] = true;
        self.list.push_back(Handler {
            dev: d.dev as u16,
            vq,
            polling,
        });
    }

    fn wake(&mut self) -> bool {
        if self.running {
            return false;
        }
        self.running = true;
        self.counters.wakeups += 1;
        true
    }

    /// ES2's interruptible sleep ended (its time, or new work): the polling
    /// handlers go back on the list.
    pub fn nap_over(&mut self, devs: &mut [VhostNet]) {
        self.napping = false;
        self.requeue_polling(devs);
    }

    fn requeue_polling(&mut self, devs: &mut [VhostNet]) {
        while let Some(h) = self.polling_list.pop_front() {
            let d = &mut devs[h.dev as usize];
            d.parked[h.vq as usize] = false;
            self.enqueue(d, h.vq, true);
        }
    }

    /// Whether a unit is under way (its completion is pending).
    pub fn busy(&self) -> bool {
        self.inflight.is_some()
    }

    /// Finishes the unit in flight, then picks the next. `devs` are the
    /// machine's vhost-net back ends and `vqs` their virtqueues, by index.
    pub fn step(
        &mut self,
        devs: &mut [VhostNet],
        vqs: &mut [VirtioNetDev],
        c: &VhostCosts,
    ) -> (Completion, Next) {
        let done = self.finish(devs, vqs, c);
        let next = self.resume(devs, vqs, c);
        (done, next)
    }

    /// Finishes the unit in flight (if any): the buffer goes to the used
    /// ring, the guest is signalled if its suppression allows.
    pub fn finish(
        &mut self,
        devs: &mut [VhostNet],
        vqs: &mut [VirtioNetDev],
        c: &VhostCosts,
    ) -> Completion {
        let done = self.complete(devs, vqs, c);
        self.counters.busy += done.extra;
        done
    }

    /// Picks the next unit of work. Without work the worker sleeps or
    /// naps.
    pub fn resume(
        &mut self,
        devs: &mut [VhostNet],
        vqs: &mut [VirtioNetDev],
        c: &VhostCosts,
    ) -> Next {
        let next = self.begin(devs, vqs, c);
        match next {
            Next::Unit(t) => self.counters.busy += t,
            Next::Sleep | Next::Nap => {
                self.running = false;
                self.napping = next == Next::Nap;
                self.counters.naps += self.napping as u64;
            }
        }
        next
    }

    fn complete(
        &mut self,
        devs: &mut [VhostNet],
        vqs: &mut [VirtioNetDev],
        c: &VhostCosts,
    ) -> Completion {
        match self.inflight.take() {
            Some(InFlight::Tx { dev, head, f }) => {
                let d = &mut devs[dev as usize];
                let vq = &mut vqs[d.dev];
                vq.tx_complete(head);
                let signal = d.signal_if(vq.tx_need_signal(), 1);
                Completion {
                    to_bridge: Some((dev, f)),
                    signal,
                    extra: if signal.is_some() { c.signal } else { 0 },
                }
            }
            Some(InFlight::Rx { dev, head, f }) => {
                let d = &mut devs[dev as usize];
                let vq = &mut vqs[d.dev];
                vq.rx_fill(head, f);
                let signal = d.signal_if(vq.rx_need_signal(), 0);
                if let Hybrid::Optimistic { .. } = self.hybrid {
                    // Algorithm 2: an ingress packet for the guest predicts
                    // its reply: TX kicks off, TX polls from now on.
                    vq.tx_suppress_notify();
                    d.is_poll = true;
                    d.poll_count = 0;
                    self.enqueue(d, Vq::Tx, true);
                }
                Completion {
                    to_bridge: None,
                    signal,
                    extra: if signal.is_some() { c.signal } else { 0 },
                }
            }
            None => Completion::default(),
        }
    }

    /// Ends the running turn; with `requeue`, the handler goes back to the
    /// tail of the list (`vhost_poll_queue`).
    fn end_turn(&mut self, devs: &mut [VhostNet], requeue: bool) {
        if let Some(t) = self.turn.take() {
            if requeue {
                self.enqueue(&mut devs[t.h.dev as usize], t.h.vq, false);
            }
        }
    }

    fn begin(&mut self, devs: &mut [VhostNet], vqs: &mut [VirtioNetDev], c: &VhostCosts) -> Next {
        debug_assert!(self.inflight.is_none());
        loop {
            let Some(mut t) = self.turn else {
                let Some(h) = self.list.pop_front() else {
                    if self.polling_list.is_empty() {
                        return Next::Sleep;
                    }
                    // ES2 §5.3: every active handler polled once; sleep
                    // 10 µs so requests accumulate.
                    return Next::Nap;
                };
                let d = &mut devs[h.dev as usize];
                d.queued[h.vq as usize] = false;
                if !h.polling {
                    // ES2 §5.3: while real work exists the polling handlers
                    // keep their turns without a sleep.
                    self.requeue_polling(devs);
                }
                self.turn = Some(Turn {
                    h,
                    bytes: 0,
                    load: 0,
                });
                continue;
            };
            let d = &mut devs[t.h.dev as usize];
            let vq = &mut vqs[d.dev];
            match t.h.vq {
                Vq::Tx => {
                    if t.bytes >= VHOST_NET_WEIGHT {
                        self.end_turn(devs, true);
                        continue;
                    }
                    if let Hybrid::Perceptive { quota } = self.hybrid {
                        if t.load >= quota {
                            // Algorithm 1: quota reached before the ring
                            // emptied: stay in polling mode, requeue at
                            // the tail; alone on the list, sleep 10 µs
                            // first (§5.2).
                            d.counters.quota_requeues += 1;
                            vq.tx_suppress_notify();
                            self.end_turn(devs, true);
                            if self.list.len() == 1 {
                                let h = self.list.pop_front().expect("just requeued");
                                devs[h.dev as usize].queued[h.vq as usize] = false;
                                devs[h.dev as usize].parked[h.vq as usize] = true;
                                self.polling_list.push_back(h);
                            }
                            continue;
                        }
                    }
                    vq.tx_disable_notify();
                    if let Some((head, f)) = vq.tx_pop() {
                        d.counters.tx_frames += 1;
                        t.bytes += f.len() as u64;
                        t.load += 1;
                        self.turn = Some(t);
                        self.inflight = Some(InFlight::Tx {
                            dev: t.h.dev,
                            head,
                            f,
                        });
                        return Next::Unit(c.tx_per_frame + c.gso_copy(&f));
                    }
                    if d.is_poll {
                        // An optimistic polling turn is over.
                        d.counters.polling_turns += 1;
                        d.poll_count += 1;
                        let max = match self.hybrid {
                            Hybrid::Optimistic { max_poll_count } => max_poll_count,
                            _ => 0,
                        };
                        if d.poll_count > max {
                            d.is_poll = false;
                            d.counters.tx_notify_enables += 1;
                            if vq.tx_enable_notify() {
                                // Enable, then recheck: requests slipped in.
                                d.counters.tx_slipped_in += 1;
                                continue;
                            }
                            self.turn = None;
                            continue;
                        }
                        let empty = t.load == 0;
                        d.counters.empty_polls += empty as u64;
                        d.parked[1] = true;
                        self.polling_list.push_back(Handler {
                            polling: true,
                            ..t.h
                        });
                        self.turn = None;
                        if empty {
                            // Looking at an empty ring costs a poll.
                            return Next::Unit(c.poll_iteration);
                        }
                        continue;
                    }
                    // Empty: re-enable kicks, then look once more (a
                    // buffer may have been added before the guest saw the
                    // re-enable). A side-core poller keeps kicks off.
                    if !d.polling {
                        d.counters.tx_notify_enables += 1;
                        if vq.tx_enable_notify() {
                            d.counters.tx_slipped_in += 1;
                            continue;
                        }
                    }
                    self.turn = None;
                }
                Vq::Rx => {
                    if t.bytes >= VHOST_NET_WEIGHT {
                        self.end_turn(devs, true);
                        continue;
                    }
                    if d.tap.is_empty() {
                        self.turn = None;
                        continue;
                    }
                    vq.rx_disable_notify();
                    if let Some(head) = vq.rx_pop_buffer() {
                        let f = d.tap.pop_front().expect("tap checked non-empty");
                        d.counters.rx_frames += 1;
                        t.bytes += f.len() as u64;
                        self.turn = Some(t);
                        self.inflight = Some(InFlight::Rx {
                            dev: t.h.dev,
                            head,
                            f,
                        });
                        return Next::Unit(c.rx_per_frame + c.gso_copy(&f));
                    }
                    // No guest buffer: wait for the refill kick (or, side-
                    // core polling, for the poller to see the refill).
                    if !d.polling && vq.rx_enable_notify() {
                        continue;
                    }
                    d.counters.rx_no_buffer += 1;
                    self.turn = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> VhostCosts {
        VhostCosts {
            wakeup: 1,
            tx_per_frame: 10,
            rx_per_frame: 20,
            copy_per_kib: 0,
            signal: 1,
            poll_iteration: 3,
        }
    }

    fn setup(n: usize, hybrid: Hybrid) -> (VhostWorker, Vec<VhostNet>, Vec<VirtioNetDev>) {
        let w = VhostWorker::new(0, hybrid);
        let devs = (0..n)
            .map(|i| VhostNet::new(i, i, 0, [2 * i as u16, 2 * i as u16 + 1], 64))
            .collect();
        let vqs = (0..n)
            .map(|_| VirtioNetDev::new(64, true, 0xC050).expect("queue size"))
            .collect();
        (w, devs, vqs)
    }

    /// Runs the worker until it sleeps or naps; returns the TX frames in
    /// the order they left and how it stopped.
    fn run(
        w: &mut VhostWorker,
        devs: &mut [VhostNet],
        vqs: &mut [VirtioNetDev],
    ) -> (Vec<(u16, u64)>, Next) {
        let mut out = Vec::new();
        loop {
            let (done, next) = w.step(devs, vqs, &costs());
            if let Some((d, f)) = done.to_bridge {
                out.push((d, f.sent));
            }
            if !matches!(next, Next::Unit(_)) {
                return (out, next);
            }
        }
    }

    /// The driver adds `n` frames and publishes them; whether it must kick.
    fn send(vq: &mut VirtioNetDev, n: u64, from: u64) -> bool {
        for i in 0..n {
            assert!(vq.tx_add(Frame::udp(1, 100, 0, from + i)));
        }
        vq.tx_kick_prepare()
    }

    /// Stock vhost: one turn drains the ring, re-enables kicks and sleeps.
    #[test]
    fn a_stock_turn_drains_the_ring_and_turns_kicks_back_on() {
        let (mut w, mut devs, mut vqs) = setup(1, Hybrid::Off);
        send(&mut vqs[0], 5, 0);
        assert!(w.queue(&mut devs[0], Vq::Tx));
        assert!(!w.queue(&mut devs[0], Vq::Tx), "already awake");
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        assert_eq!(out.len(), 5);
        assert_eq!(next, Next::Sleep);
        assert!(!w.running);
        // Kicks are on again: the driver's next add must notify.
        assert!(send(&mut vqs[0], 1, 10), "kicks re-enabled");
    }

    /// A joint thread serves its devices' handlers in FIFO order.
    #[test]
    fn a_joint_worker_serves_handlers_in_the_order_they_were_queued() {
        let (mut w, mut devs, mut vqs) = setup(2, Hybrid::Off);
        send(&mut vqs[1], 2, 100);
        send(&mut vqs[0], 2, 0);
        w.queue(&mut devs[1], Vq::Tx);
        w.queue(&mut devs[0], Vq::Tx);
        let (out, _) = run(&mut w, &mut devs, &mut vqs);
        let order: Vec<u16> = out.iter().map(|o| o.0).collect();
        assert_eq!(order, vec![1, 1, 0, 0]);
    }

    /// Perceptive: a turn that reaches the quota keeps kicks off and
    /// requeues behind the other handlers; alone, the worker naps first.
    #[test]
    fn perceptive_quota_keeps_polling_and_requeues_at_the_tail() {
        let (mut w, mut devs, mut vqs) = setup(2, Hybrid::Perceptive { quota: 2 });
        send(&mut vqs[0], 5, 0);
        send(&mut vqs[1], 1, 100);
        w.queue(&mut devs[0], Vq::Tx);
        w.queue(&mut devs[1], Vq::Tx);
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        let order: Vec<u16> = out.iter().map(|o| o.0).collect();
        // dev0 takes 2 (quota), dev1 its 1 (ring empties: notification
        // mode), dev0 2 more, then alone at quota: nap.
        assert_eq!(order, vec![0, 0, 1, 0, 0]);
        assert_eq!(next, Next::Nap);
        assert!(devs[0].counters.quota_requeues >= 2);
        // Still polling: the driver does not kick.
        assert!(!send(&mut vqs[0], 1, 50), "kicks stay off while polling");
        // dev1 went back to notification mode.
        assert!(send(&mut vqs[1], 1, 150));
        // Two requests wait: the quota is reached again (Algorithm 1 tests
        // it right after each request), so the worker naps once more.
        w.nap_over(&mut devs);
        assert!(w.wake());
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        assert_eq!(out.len(), 2);
        assert_eq!(next, Next::Nap);
        // Then the ring is empty before the quota: kicks go back on.
        w.nap_over(&mut devs);
        assert!(w.wake());
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        assert!(out.is_empty());
        assert_eq!(next, Next::Sleep);
        assert!(send(&mut vqs[0], 1, 60), "back to notification mode");
    }

    /// Optimistic: an RX packet turns TX into a polling handler that finds
    /// the reply without a kick, and stops polling after max_poll_count
    /// empty turns, re-enabling kicks.
    #[test]
    fn optimistic_rx_starts_tx_polling_until_max_poll_count() {
        let (mut w, mut devs, mut vqs) = setup(1, Hybrid::Optimistic { max_poll_count: 3 });
        // Guest RX buffers, and a frame on the tap.
        while vqs[0].rx_add_buffer() {}
        vqs[0].rx_kick_prepare();
        assert!(devs[0].tap_receive(Frame::udp(1, 100, 0, 7)));
        w.queue(&mut devs[0], Vq::Rx);
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        assert!(out.is_empty());
        assert_eq!(
            next,
            Next::Nap,
            "the polling TX handler waits for its next turn"
        );
        // The guest replies: no kick needed.
        assert!(!send(&mut vqs[0], 1, 9), "TX kicks are off");
        w.nap_over(&mut devs);
        w.wake();
        let (out, next) = run(&mut w, &mut devs, &mut vqs);
        assert_eq!(out, vec![(0, 9)], "the poller found the reply");
        assert_eq!(next, Next::Nap);
        // Empty turns until poll_count exceeds max_poll_count.
        let mut naps = 0;
        loop {
            w.nap_over(&mut devs);
            w.wake();
            let (_, next) = run(&mut w, &mut devs, &mut vqs);
            if next == Next::Sleep {
                break;
            }
            naps += 1;
            assert!(naps < 10, "polling must stop");
        }
        assert_eq!(devs[0].counters.polling_turns, 4);
        assert!(send(&mut vqs[0], 1, 20), "kicks back on after polling");
    }

    /// Linux 3.6/4.4 `handle_tx` with EVENT_IDX, seen from both sides: a
    /// driver that adds each frame only after the worker has drained the
    /// ring and re-enabled kicks (a request/response server, a slow
    /// sender) kicks for every frame; the worker re-enables once per frame.
    #[test]
    fn a_driver_slower_than_the_worker_kicks_for_every_frame() {
        let (mut w, mut devs, mut vqs) = setup(1, Hybrid::Off);
        for i in 0..10 {
            assert!(send(&mut vqs[0], 1, i), "frame {i}: the ring was drained");
            assert_eq!(devs[0].kicked(1), Some(Vq::Tx));
            w.queue(&mut devs[0], Vq::Tx);
            let (out, next) = run(&mut w, &mut devs, &mut vqs);
            assert_eq!((out.len(), next), (1, Next::Sleep));
        }
        let c = devs[0].counters;
        assert_eq!((c.tx_kicks, c.tx_notify_enables, c.tx_frames), (10, 10, 10));
        assert_eq!(c.tx_slipped_in, 0);
    }

    /// The other side: a driver that adds frames while the worker's turn
    /// runs (faster than the worker's per-frame work) kicks once, for the
    /// first; `avail_event` stays where the last re-enable put it, so no
    /// later publication crosses it until the worker drains the ring.
    #[test]
    fn a_driver_faster_than_the_worker_kicks_once_per_drain() {
        let (mut w, mut devs, mut vqs) = setup(1, Hybrid::Off);
        assert!(send(&mut vqs[0], 1, 0));
        devs[0].kicked(1);
        w.queue(&mut devs[0], Vq::Tx);
        let mut sent = 1;
        let mut frames = 0;
        loop {
            let (done, next) = w.step(&mut devs, &mut vqs, &costs());
            frames += done.to_bridge.is_some() as u64;
            if sent < 20 {
                // Two frames per frame the worker takes: kicks stay off.
                for _ in 0..2 {
                    assert!(!send(&mut vqs[0], 1, sent), "no kick mid-turn");
                    sent += 1;
                }
                // The driver reclaims what the worker used.
                vqs[0].tx_reclaim();
            }
            if next == Next::Sleep {
                break;
            }
        }
        assert_eq!(frames, sent);
        let c = devs[0].counters;
        assert_eq!((c.tx_kicks, c.tx_notify_enables), (1, 1));
        // Kicks are on again after the drain.
        assert!(send(&mut vqs[0], 1, 99));
    }

    /// The enable-then-recheck rule: a buffer added between the last pop
    /// and the re-enable is still sent.
    #[test]
    fn a_request_that_slips_in_at_the_re_enable_is_not_stranded() {
        let (mut w, mut devs, mut vqs) = setup(1, Hybrid::Off);
        send(&mut vqs[0], 1, 0);
        w.queue(&mut devs[0], Vq::Tx);
        let (_, next) = w.step(&mut devs, &mut vqs, &costs());
        assert_eq!(next, Next::Unit(10));
        // Added while kicks are off: the driver does not kick.
        assert!(!send(&mut vqs[0], 1, 1));
        let (out, _) = run(&mut w, &mut devs, &mut vqs);
        assert_eq!(out.len(), 2, "both frames left");
    }
}
