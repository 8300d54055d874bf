//! The guest's virtio-blk driver (Linux 3.6 `virtio_blk.c` in spirit) and
//! the block queue tasks submit to. A request goes into the virtqueue and
//! the driver kicks (a PIO write to the notify port, an ioeventfd exit)
//! when the device asked; the completion interrupt's handler (`blk_done`)
//! drains the used ring with callbacks off, re-enables them, and wakes the
//! waiting task. Each submission arms the application's guard hrtimer and
//! each completion cancels it (DID §5.6: "Fio arms a guard timer per
//! request"), which moves the clockevent when that timer is the next one.

use super::{Action, FrameKind, HrKind, Kernel, KernelOp};
use crate::engine::Time;
use crate::hw::virtio_blk::{BlkRequest, VirtioBlkDev};
use std::collections::VecDeque;

/// The guest's view of its virtio-blk device.
#[derive(Clone, Copy, Debug)]
pub struct VirtioBlkGuest {
    /// MSI-X vector of the request queue.
    pub vector: u8,
    /// Its notify port.
    pub notify_port: u16,
    /// The application's guard timer per request (0: none).
    pub guard: Time,
}

/// A task's block queue: requests it submitted and completions for it.
#[derive(Debug, Default)]
pub struct BlkQueue {
    /// Submitted, not yet given to the device.
    pub submit: VecDeque<BlkRequest>,
    /// Completed: the request and when its completion reached the task.
    pub done: VecDeque<(BlkRequest, Time)>,
}

impl Kernel {
    /// Whether `vector` is the virtio-blk device's.
    pub(super) fn is_blk_vector(&self, vector: u8) -> bool {
        self.cfg.virtio_blk.is_some_and(|c| c.vector == vector)
    }

    /// `blk_done`: take every completed request (callbacks off while
    /// draining, back on at the end, drain again if more slipped in) and
    /// wake the task. Returns the handler's work.
    pub(super) fn blk_irq(&mut self, now: Time, dev: Option<&mut VirtioBlkDev>) -> Time {
        let Some(dev) = dev else { return 0 };
        let mut n = 0;
        loop {
            dev.disable_cb();
            while let Some(r) = dev.get_done() {
                self.blk.done.push_back((r, now));
                n += 1;
            }
            if dev.enable_cb() {
                break;
            }
        }
        if n > 0 {
            // The guard timers of the completed requests are cancelled.
            // They were armed on the submitting task's CPU; cancelling one
            // from another CPU leaves that CPU's clockevent as it was
            // (`__remove_hrtimer` reprograms only the local base), so it
            // may fire and find nothing expired.
            let home = self.blk_task.map_or(self.on, |t| self.tasks[t].cpu);
            self.cpus[home].hrtimers.retain(|h| h.1 != HrKind::Guard);
            if let Some(t) = self.blk_task {
                self.wake(t);
            }
        }
        self.cfg.costs.blk_complete * n as Time
    }

    /// One step of the submission frame (`virtblk_request` for each queued
    /// request, then the kick decision).
    pub(super) fn blk_submit_step(
        &mut self,
        top: usize,
        stage: u8,
        now: Time,
        dev: Option<&mut VirtioBlkDev>,
    ) -> Option<Action> {
        let (Some(cfg), Some(dev)) = (self.cfg.virtio_blk, dev) else {
            self.blk.submit.clear();
            self.pop();
            return None;
        };
        match stage {
            0 => {
                let Some(r) = self.blk.submit.pop_front() else {
                    self.pop();
                    return None;
                };
                if !dev.add(r) {
                    // Queue full: the request waits (iodepth above the ring).
                    self.blk.submit.push_front(r);
                    self.pop();
                    return None;
                }
                if cfg.guard > 0 {
                    self.cpus[self.on]
                        .hrtimers
                        .push((now + cfg.guard, HrKind::Guard));
                }
                self.set_stage(top, 1, self.cfg.costs.blk_submit);
                None
            }
            _ => {
                self.set_stage(top, 0, 0);
                if dev.kick_prepare() {
                    return Some(Action::Op(KernelOp::QueueNotify {
                        port: cfg.notify_port,
                        value: 0,
                    }));
                }
                None
            }
        }
    }

    /// Pushes the submission frame if a task queued requests: on the
    /// submitting task's CPU (`submit_bio` runs in its context).
    pub(super) fn blk_pending(&mut self) -> bool {
        if self.blk.submit.is_empty() || self.blk_task.is_some_and(|t| self.tasks[t].cpu != self.on)
        {
            return false;
        }
        self.push(FrameKind::BlkSubmit, 0, true);
        true
    }
}
