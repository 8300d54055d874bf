//! The block path on the platform: the RAM-disk back end's I/O thread on a
//! host core, woken by the ioeventfd kick, and the irqfd that raises the
//! guest's completion interrupt through the scheme.

use super::event::Ev;
use super::World;
use crate::hv::blk_backend::{BlkCosts, RamDiskBackend};

/// The host side of the VM's virtio-blk device.
pub(super) struct BlkPath {
    pub(super) backend: RamDiskBackend,
    pub(super) costs: BlkCosts,
}

impl World {
    /// An eventfd fired: the block device's kick, if it is its fd.
    pub(super) fn blk_eventfd(&mut self, fd: u16) {
        let Some(b) = &mut self.blk else { return };
        if b.backend.kick(fd) == Some(true) {
            let w = b.costs.wakeup;
            self.q.schedule_in(w, Ev::BlkStep);
        }
    }

    /// The I/O thread finished a request (or woke up): complete it, start
    /// the next, signal the guest if it asked.
    pub(super) fn blk_step(&mut self) {
        let now = self.q.now();
        let Some(b) = &mut self.blk else { return };
        let Some(dev) = self.m.virtio_blk.first_mut() else {
            return;
        };
        let signal = b.backend.complete(dev);
        let extra = if signal { b.costs.signal } else { 0 };
        if let Some(cost) = b.backend.begin(dev, &b.costs) {
            self.q.schedule(now + extra + cost, Ev::BlkStep);
        }
        if signal {
            let (vm, vector) = (b.backend.vm, b.backend.vector);
            self.checker.raised(vm, vector, now);
            let vcpu = self.hv.vms[vm].vcpus[0];
            let (mut cx, scheme) = self.cx();
            scheme.virtual_interrupt(&mut cx, vcpu, vector);
        }
    }
}
