//! The block path on the platform: QEMU's main loop and its thread pool
//! (`crate::hv::blk_backend`) on host cores, woken by the ioeventfd kick,
//! and the completion interrupt raised through the scheme.

use super::event::Ev;
use super::World;
use crate::calibration::Calibration;
use crate::engine::Time;
use crate::hv::blk_backend::{BlkCosts, RamDiskBackend};
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// The host side of the VM's virtio-blk device.
pub(super) struct BlkPath {
    pub(super) backend: RamDiskBackend,
    pub(super) costs: BlkCosts,
    /// Times a `BlkStep` is queued for (one event per time).
    armed: BTreeSet<Time>,
}

impl BlkPath {
    /// The back end of VM 0's disk of `disk_bytes`, with the calibrated
    /// costs.
    pub(super) fn new(cal: &Calibration, kick_fd: u16, vector: u8, disk_bytes: u64) -> BlkPath {
        let (b, us, ns) = (&cal.blk, super::t_us, super::t_ns);
        BlkPath {
            backend: RamDiskBackend::new(0, kick_fd, vector, disk_bytes),
            costs: BlkCosts {
                wakeup: us(&b.wakeup_us),
                submit: us(&b.submit_us),
                io: us(&b.io_us),
                copy_per_kib: ns(&b.copy_per_kib_ns),
                complete: us(&b.complete_us),
                signal: ns(&cal.vhost.signal_ns),
                thread_create: us(&b.thread_create_us),
            },
            armed: BTreeSet::new(),
        }
    }

    /// The back end's counters as metrics.
    pub(super) fn metrics(&self, m: &mut BTreeMap<String, f64>) {
        let c = &self.backend.counters;
        for (k, v) in [
            ("blk.kicks", c.kicks),
            ("blk.requests", c.requests),
            ("blk.signals", c.signals),
            ("blk.out_of_range", self.backend.out_of_range),
            ("blk.main_wakeups", c.main_wakeups),
            ("blk.worker_wakeups", c.worker_wakeups),
            ("blk.threads_created", c.threads_created),
        ] {
            m.insert(k.into(), v as f64);
        }
    }
}

impl World {
    /// Queues a `BlkStep` for the back end's next due time.
    fn blk_arm(&mut self) {
        let Some(b) = &mut self.blk else { return };
        if let Some(t) = b.backend.next_due() {
            if b.armed.insert(t) {
                self.q.schedule(t, Ev::BlkStep);
            }
        }
    }

    /// An eventfd fired: the block device's kick, if it is its fd.
    pub(super) fn blk_eventfd(&mut self, fd: u16) {
        let now = self.q.now();
        let Some(b) = &mut self.blk else { return };
        if b.backend.kick(fd, now, &b.costs) {
            self.blk_arm();
        }
    }

    /// Something in QEMU's threads came due: run it, signal the guest if
    /// the main loop did.
    pub(super) fn blk_step(&mut self) {
        let now = self.q.now();
        let Some(b) = &mut self.blk else { return };
        b.armed.remove(&now);
        let Some(dev) = self.m.virtio_blk.first_mut() else {
            return;
        };
        let out = b.backend.step(now, dev, &b.costs);
        let (vm, vector) = (b.backend.vm, b.backend.vector);
        self.blk_arm();
        if out.signal {
            self.checker.raised(vm, vector, now);
            let vcpu = self.hv.vms[vm].vcpus[0];
            let (mut cx, scheme) = self.cx();
            scheme.virtual_interrupt(&mut cx, vcpu, vector);
        }
    }
}
