//! The virtio-blk back end DID's Fio test uses (§5.6): QEMU's virtio-blk
//! with an ioeventfd, served by an I/O thread on a host core, over a RAM
//! disk. A kick wakes the thread; it takes each available request, copies
//! the data to or from the RAM disk, returns the request to the used ring
//! and signals the guest through the irqfd if its suppression allows. With
//! the queue empty it re-enables kicks and looks once more.

use crate::engine::Time;
use crate::hw::virtio_blk::VirtioBlkDev;

/// Costs of the back end (from the calibration file).
#[derive(Clone, Copy, Debug, Default)]
pub struct BlkCosts {
    /// Waking the sleeping I/O thread.
    pub wakeup: Time,
    /// Per request: pop, parse, submit to the RAM disk, complete.
    pub request: Time,
    /// RAM-disk copy per KiB.
    pub copy_per_kib: Time,
    /// Signalling the guest (eventfd → irqfd).
    pub signal: Time,
}

/// Counters of the back end.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct BlkCounters {
    pub kicks: u64,
    pub wakeups: u64,
    pub requests: u64,
    pub signals: u64,
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
    work: bool,
    /// The I/O thread is running.
    pub running: bool,
    inflight: Option<u16>,
    /// Requests past the end of the disk.
    pub out_of_range: u64,
    /// Counters.
    pub counters: BlkCounters,
}

impl RamDiskBackend {
    /// A back end for `vm` over a RAM disk of `capacity` bytes.
    pub fn new(vm: usize, kick_fd: u16, vector: u8, capacity: u64) -> Self {
        RamDiskBackend {
            vm,
            kick_fd,
            vector,
            capacity,
            work: false,
            running: false,
            inflight: None,
            out_of_range: 0,
            counters: BlkCounters::default(),
        }
    }

    /// An eventfd fired: Some(true) if it is this device's kick and the
    /// thread must be woken.
    pub fn kick(&mut self, fd: u16) -> Option<bool> {
        if fd != self.kick_fd {
            return None;
        }
        self.counters.kicks += 1;
        self.work = true;
        if self.running {
            return Some(false);
        }
        self.running = true;
        self.counters.wakeups += 1;
        Some(true)
    }

    /// Finishes the request in flight; returns whether to signal the guest.
    pub fn complete(&mut self, dev: &mut VirtioBlkDev) -> bool {
        let Some(head) = self.inflight.take() else {
            return false;
        };
        dev.complete(head);
        let s = dev.need_signal();
        if s {
            self.counters.signals += 1;
        }
        s
    }

    /// Starts the next request: its cost, or None when the thread sleeps.
    pub fn begin(&mut self, dev: &mut VirtioBlkDev, c: &BlkCosts) -> Option<Time> {
        while self.work {
            dev.disable_notify();
            if let Some((head, r)) = dev.pop() {
                self.counters.requests += 1;
                if r.sector * 512 + r.len as u64 > self.capacity {
                    self.out_of_range += 1;
                }
                self.inflight = Some(head);
                return Some(c.request + c.copy_per_kib * r.len as Time / 1024);
            }
            if !dev.enable_notify() {
                self.work = false;
            }
        }
        self.running = false;
        None
    }
}
