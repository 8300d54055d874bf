//! vhost-net: the in-kernel back end of a virtio-net device (Linux 3.6
//! `drivers/vhost/net.c` in spirit). One worker thread, pinned to its own
//! host core, serves the device's two virtqueues:
//!
//! * **TX** (`handle_tx`): woken by the guest's kick through an ioeventfd;
//!   with guest notifications disabled it takes every available buffer,
//!   hands the frame to the tap device (and so the bridge), returns the
//!   buffer to the used ring, and signals the guest only if it asked
//!   (`vhost_signal` → irqfd). When the ring is empty it re-enables
//!   notifications and looks once more, so a kick is never lost.
//! * **RX** (`handle_rx`): woken when the tap socket has frames; copies each
//!   into the next available guest buffer, adds it to the used ring and
//!   signals through the irqfd if the guest's suppression allows. Out of
//!   guest buffers, it re-enables notifications and waits for the guest's
//!   refill kick.
//!
//! Both handlers stop after `VHOST_NET_WEIGHT` bytes and requeue, so one
//! direction cannot starve the other. The worker sleeps when neither has
//! work; waking it costs a wake-up latency.
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
    /// `vhost_signal` → eventfd → irqfd injection request.
    pub signal: Time,
    /// One iteration of a polling worker's loop: how soon it sees new work.
    pub poll_iteration: Time,
}

impl VhostCosts {
    /// How long new work waits before the worker acts on it.
    pub fn start_latency(&self, polling: bool) -> Time {
        if polling {
            self.poll_iteration
        } else {
            self.wakeup
        }
    }
}

/// A unit of work the worker has started and finishes after its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// TX buffer `head` holds frame `f`, being sent to the tap.
    Tx {
        /// Descriptor head.
        head: u16,
        /// The frame.
        f: Frame,
    },
    /// Frame `f` from the tap is being copied into RX buffer `head`.
    Rx {
        /// Descriptor head.
        head: u16,
        /// The frame.
        f: Frame,
    },
}

/// What finishing a unit of work did, for the platform to carry out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// A frame the guest sent, now on the bridge.
    pub to_bridge: Option<Frame>,
    /// Raise the guest's interrupt for this queue (irqfd).
    pub signal: Option<usize>,
    /// Worker time the signal took (delays the next unit).
    pub extra: Time,
}

/// Counters of one vhost-net device.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct VhostCounters {
    pub kicks: u64,
    pub wakeups: u64,
    pub tx_frames: u64,
    pub rx_frames: u64,
    pub signals: u64,
    pub signals_suppressed: u64,
    pub tap_drops: u64,
    pub rx_no_buffer: u64,
}

/// One vhost-net device and its worker thread.
#[derive(Clone, Debug)]
pub struct VhostNet {
    /// The VM it serves.
    pub vm: usize,
    /// The virtio-net device index on the machine.
    pub dev: usize,
    /// Host core the worker is pinned to.
    pub core: usize,
    /// Ioeventfd the guest's RX and TX queue notifies signal, per queue.
    pub kick_fd: [u16; 2],
    /// The tap socket's receive queue: frames from the bridge for the guest.
    pub tap: VecDeque<Frame>,
    /// Its capacity (`tx_queue_len`-like; further frames are dropped).
    pub tap_capacity: usize,
    /// Work queued for the worker: bit 0 RX, bit 1 TX.
    work: u8,
    /// Bytes moved in the current handler run.
    run_bytes: u64,
    /// The worker is running (not asleep, or, when polling, not idle).
    pub running: bool,
    /// ELVIS side-core mode: the worker polls the virtqueues from its
    /// dedicated core; guest notifications stay disabled for good and the
    /// platform tells the worker about new buffers after one poll
    /// iteration.
    pub polling: bool,
    /// Avail index of each queue (RX, TX) when the poller last looked.
    pub polled_avail: [u16; 2],
    /// The unit of work under way.
    inflight: Option<InFlight>,
    /// Counters.
    pub counters: VhostCounters,
}

const RX: u8 = 1;
const TX: u8 = 2;

impl VhostNet {
    /// A device served by a worker on `core`.
    pub fn new(vm: usize, dev: usize, core: usize, kick_fd: [u16; 2], tap_capacity: usize) -> Self {
        VhostNet {
            vm,
            dev,
            core,
            kick_fd,
            tap: VecDeque::with_capacity(tap_capacity),
            tap_capacity,
            work: 0,
            run_bytes: 0,
            running: false,
            polling: false,
            polled_avail: [0; 2],
            inflight: None,
            counters: VhostCounters::default(),
        }
    }

    /// The poller looked at the rings: new available buffers mean work.
    /// Returns true if the worker must be started (it was idle).
    pub fn poll_rings(&mut self, vq: &VirtioNetDev) -> bool {
        let avail = [vq.rx_ring().avail_idx, vq.tx_ring().avail_idx];
        if avail == self.polled_avail {
            return false;
        }
        if avail[1] != self.polled_avail[1] {
            self.work |= TX;
        }
        if avail[0] != self.polled_avail[0] && !self.tap.is_empty() {
            self.work |= RX;
        }
        self.polled_avail = avail;
        self.work != 0 && self.wake()
    }

    /// An eventfd fired. Returns true if it is one of this device's kicks
    /// and the worker must be woken (it was asleep).
    pub fn kick(&mut self, fd: u16) -> Option<bool> {
        let q = self.kick_fd.iter().position(|&k| k == fd)?;
        self.counters.kicks += 1;
        self.work |= if q == 0 { RX } else { TX };
        Some(self.wake())
    }

    /// A frame arrived on the tap socket (from the bridge). Returns true if
    /// the worker must be woken.
    pub fn tap_receive(&mut self, f: Frame) -> bool {
        if self.tap.len() >= self.tap_capacity {
            self.counters.tap_drops += 1;
            return false;
        }
        self.tap.push_back(f);
        self.work |= RX;
        self.wake()
    }

    fn wake(&mut self) -> bool {
        if self.running {
            return false;
        }
        self.running = true;
        self.counters.wakeups += 1;
        true
    }

    /// Finishes the unit of work in flight: the buffer goes to the used
    /// ring, the guest is signalled if its suppression allows.
    pub fn complete(&mut self, vq: &mut VirtioNetDev, c: &VhostCosts) -> Completion {
        match self.inflight.take() {
            Some(InFlight::Tx { head, f }) => {
                vq.tx_complete(head);
                let signal = self.signal_if(vq.tx_need_signal(), 1);
                Completion {
                    to_bridge: Some(f),
                    signal,
                    extra: if signal.is_some() { c.signal } else { 0 },
                }
            }
            Some(InFlight::Rx { head, f }) => {
                vq.rx_fill(head, f);
                let signal = self.signal_if(vq.rx_need_signal(), 0);
                Completion {
                    to_bridge: None,
                    signal,
                    extra: if signal.is_some() { c.signal } else { 0 },
                }
            }
            None => Completion::default(),
        }
    }

    /// Starts the next unit of work: a frame of TX first, else a frame of
    /// RX. Returns how long it takes, or None when the worker goes to
    /// sleep.
    pub fn begin(&mut self, vq: &mut VirtioNetDev, c: &VhostCosts) -> Option<Time> {
        debug_assert!(self.inflight.is_none());
        loop {
            if self.work & TX != 0 && !(self.run_bytes >= VHOST_NET_WEIGHT && self.work & RX != 0) {
                vq.tx_disable_notify();
                if let Some((head, f)) = vq.tx_pop() {
                    self.counters.tx_frames += 1;
                    self.run_bytes += f.len() as u64;
                    self.inflight = Some(InFlight::Tx { head, f });
                    return Some(c.tx_per_frame);
                }
                // Empty: re-enable kicks, then look once more (a buffer
                // may have been added before the guest saw the re-enable).
                // A polling worker keeps kicks off and just moves on.
                if !self.polling && vq.tx_enable_notify() {
                    continue;
                }
                self.work &= !TX;
                self.run_bytes = 0;
                continue;
            }
            if self.run_bytes >= VHOST_NET_WEIGHT {
                // vhost_poll_queue: requeue behind the other handler.
                self.run_bytes = 0;
            }
            if self.work & RX != 0 {
                if self.tap.is_empty() {
                    self.work &= !RX;
                    self.run_bytes = 0;
                    continue;
                }
                vq.rx_disable_notify();
                if let Some(head) = vq.rx_pop_buffer() {
                    if let Some(f) = self.tap.pop_front() {
                        self.counters.rx_frames += 1;
                        self.run_bytes += f.len() as u64;
                        self.inflight = Some(InFlight::Rx { head, f });
                        return Some(c.rx_per_frame);
                    }
                }
                // No guest buffer: wait for the refill kick (or, polling,
                // for the poller to see the refill).
                if !self.polling && vq.rx_enable_notify() {
                    continue;
                }
                self.counters.rx_no_buffer += 1;
                self.work &= !RX;
                continue;
            }
            self.running = false;
            return None;
        }
    }

    fn signal_if(&mut self, need: bool, queue: usize) -> Option<usize> {
        if need {
            self.counters.signals += 1;
            Some(queue)
        } else {
            self.counters.signals_suppressed += 1;
            None
        }
    }
}
