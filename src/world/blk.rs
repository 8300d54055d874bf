//! The block path on the platform: each VM's QEMU main loop and its thread
//! pool (`crate::hv::blk_backend`) on host cores, woken by the ioeventfd
//! kick of that VM's device, and the completion interrupt raised through
//! the scheme as KVM routes the device's MSI.

use super::event::Ev;
use super::World;
use crate::calibration::Calibration;
use crate::engine::Time;
use crate::hv::blk_backend::{BlkCosts, RamDiskBackend};
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// The host side of one VM's virtio-blk device.
pub(super) struct BlkPath {
    pub(super) backend: RamDiskBackend,
    pub(super) costs: BlkCosts,
    /// Times a `BlkStep` is queued for (one event per time).
    armed: BTreeSet<Time>,
}

impl BlkPath {
    /// The back end of VM `vm`'s disk of `disk_bytes`, kicked through
    /// eventfd `kick_fd`, with the calibrated costs.
    pub(super) fn new(
        cal: &Calibration,
        vm: usize,
        kick_fd: u16,
        vector: u8,
        disk_bytes: u64,
        display: bool,
    ) -> BlkPath {
        let (b, us, ns) = (&cal.blk, super::t_us, super::t_ns);
        BlkPath {
            backend: RamDiskBackend::new(vm, kick_fd, vector, disk_bytes, display),
            costs: BlkCosts {
                wakeup: us(&b.wakeup_us),
                submit: us(&b.submit_us),
                io: us(&b.io_us),
                copy_per_kib: ns(&b.copy_per_kib_ns),
                complete: us(&b.complete_us),
                signal: ns(&cal.vhost.signal_ns),
                thread_create: us(&b.thread_create_us),
                paio_lock: ns(&b.paio_lock_ns),
                display_refresh: us(&b.display_refresh_us),
            },
            armed: BTreeSet::new(),
        }
    }

    /// The back end's counters as metrics, under its VM's prefix (VM 0's
    /// by their plain names).
    pub(super) fn metrics(&self, m: &mut BTreeMap<String, f64>) {
        let c = &self.backend.counters;
        let vm = self.backend.vm;
        let prefix = crate::report::vm_prefix(vm);
        for (k, v) in [
            ("blk.kicks", c.kicks),
            ("blk.requests", c.requests),
            ("blk.signals", c.signals),
            ("blk.out_of_range", self.backend.out_of_range),
            ("blk.main_wakeups", c.main_wakeups),
            ("blk.worker_wakeups", c.worker_wakeups),
            ("blk.threads_created", c.threads_created),
            ("blk.display_refreshes", c.refreshes),
            ("blk.walk_reads", c.walk_reads),
            ("blk.vcpu_mutex_waits", c.vcpu_mutex_waits),
            ("blk.main_mutex_waits", c.main_mutex_waits),
        ] {
            m.insert(format!("{prefix}{k}"), v as f64);
        }
        m.insert(
            format!("{prefix}blk.vcpu_mutex_wait_us"),
            crate::engine::as_us(c.vcpu_mutex_wait),
        );
    }
}

impl World {
    /// A vCPU of `vm` exits to QEMU in user space for `hold` (an exit
    /// QEMU emulates): how long it first waits for the global mutex its
    /// VM's main loop may hold (0 when the VM has no modelled main loop).
    pub(super) fn blk_vcpu_lock(&mut self, vm: usize, hold: Time) -> Time {
        let now = self.q.now();
        let Some(d) = self.blk.iter().position(|b| b.backend.vm == vm) else {
            return 0;
        };
        let b = &mut self.blk[d];
        let wait = b.backend.vcpu_lock(now, hold, &b.costs);
        // A main loop woken meanwhile now waits for the vCPU.
        self.blk_arm(d);
        wait
    }

    /// Queues a `BlkStep` for back end `d`'s next due time.
    fn blk_arm(&mut self, d: usize) {
        let Some(b) = self.blk.get_mut(d) else { return };
        if let Some(t) = b.backend.next_due() {
            if b.armed.insert(t) {
                self.q.schedule(t, Ev::BlkStep { dev: d as u16 });
            }
        }
    }

    /// An eventfd fired: a block device's kick, if it is one's fd.
    pub(super) fn blk_eventfd(&mut self, fd: u16) {
        let now = self.q.now();
        let Some(d) = self
            .blk
            .iter_mut()
            .position(|b| b.backend.kick(fd, now, &b.costs))
        else {
            return;
        };
        self.blk_arm(d);
    }

    /// Something in device `d`'s QEMU threads came due: run it, and
    /// signal the guest if the main loop did.
    pub(super) fn blk_step(&mut self, d: usize) {
        let now = self.q.now();
        let Some(b) = self.blk.get_mut(d) else { return };
        b.armed.remove(&now);
        let Some(dev) = self.m.virtio_blk.get_mut(d) else {
            return;
        };
        let out = b.backend.step(now, dev, &b.costs);
        let (vm, vector) = (b.backend.vm, b.backend.vector);
        self.blk_arm(d);
        if out.signal {
            // virtio_notify → the irqfd: the MSI goes where KVM routes the
            // VM's device interrupts (its affinity, lowest-priority
            // arbitration, ES2's redirection), as virtio-net's does.
            self.irqfd(vm, vector);
        }
    }
}
