//! The guest's block path for a virtio-blk disk (Linux 3.6, single-queue
//! block layer with CFQ, `virtio_blk.c`) and the block queue tasks submit
//! to. A direct-I/O read or write runs, in the task's context:
//!
//! 1. `__blockdev_direct_IO` under a plug (`blk_start_plug`): the bio is
//!    built and `blk_queue_bio` turns it into a request on the task's plug
//!    list (`blk.submit_ns` each);
//! 2. `blk_finish_plug` → `blk_flush_plug_list`: each plugged request is
//!    inserted into the elevator, CFQ's sort tree (`cfq_insert_request`,
//!    `blk.elv_insert_ns` each);
//! 3. `__blk_run_queue` → `do_virtblk_request`: CFQ dispatches each request
//!    (`cfq_dispatch_requests`), `blk_start_request`, and `do_req` adds it
//!    to the virtqueue (`blk.dispatch_ns` each);
//! 4. one `virtqueue_kick` when requests were issued: a PIO write to the
//!    notify port (an ioeventfd exit) when the device asked.
//!
//! The completion interrupt's handler (`blk_done`) ends each request in
//! the hard interrupt (`__blk_end_request_all` under the queue lock: 3.6's
//! driver raises no BLOCK_SOFTIRQ) and wakes the waiting task. Each
//! submission arms the application's guard hrtimer and each completion
//! cancels it (DID §5.6: "Fio arms a guard timer per request"), which moves
//! the clockevent when that timer is the next one.

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

/// The kernel's side of the disk's request queue: the submitting task's
/// plug list and the elevator's queue.
#[derive(Debug, Default)]
pub(super) struct RequestQueue {
    /// Requests on the task's plug list (`blk_queue_bio` with a plug).
    plugged: VecDeque<BlkRequest>,
    /// Requests inserted into CFQ, not yet dispatched to the driver.
    elevator: VecDeque<BlkRequest>,
    /// Requests issued to the driver since the queue was last run.
    issued: u32,
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

    /// One step of the submission frame: stage 0 plugs each submitted
    /// request, stage 1 flushes the plug into the elevator, stage 2
    /// dispatches each request to the virtqueue, stage 3 kicks.
    pub(super) fn blk_submit_step(
        &mut self,
        top: usize,
        stage: u8,
        now: Time,
        dev: Option<&mut VirtioBlkDev>,
    ) -> Option<Action> {
        let (Some(cfg), Some(dev)) = (self.cfg.virtio_blk, dev) else {
            self.blk.submit.clear();
            self.rq = RequestQueue::default();
            self.pop();
            return None;
        };
        let c = &self.cfg.costs;
        match stage {
            // submit_bio → blk_queue_bio: onto the plug list.
            0 => match self.blk.submit.pop_front() {
                Some(r) => {
                    self.rq.plugged.push_back(r);
                    self.set_stage(top, 0, c.blk_submit);
                }
                None if self.rq.plugged.is_empty() => self.pop(),
                None => self.set_stage(top, 1, 0),
            },
            // blk_finish_plug: every plugged request into CFQ.
            1 => {
                let n = self.rq.plugged.len() as Time;
                self.rq.elevator.extend(self.rq.plugged.drain(..));
                self.set_stage(top, 2, n * c.blk_elv_insert);
            }
            // __blk_run_queue → do_virtblk_request, one request a step.
            2 => {
                let Some(r) = self.rq.elevator.pop_front() else {
                    self.set_stage(top, 3, 0);
                    return None;
                };
                if !dev.add(r) {
                    // Ring full: blk_stop_queue; the rest stay in the
                    // elevator and go with the next run of the queue (the
                    // restart from blk_done is not modelled: the model's
                    // Fio keeps one request in flight).
                    self.rq.elevator.push_front(r);
                    self.set_stage(top, 3, 0);
                    return None;
                }
                self.rq.issued += 1;
                if cfg.guard > 0 {
                    self.cpus[self.on]
                        .hrtimers
                        .push((now + cfg.guard, HrKind::Guard));
                }
                self.set_stage(top, 2, c.blk_dispatch);
            }
            // virtqueue_kick if anything was issued, then look again for
            // requests submitted meanwhile (or pop when there are none).
            _ => {
                let issued = std::mem::take(&mut self.rq.issued);
                self.set_stage(top, 0, 0);
                if issued > 0 && dev.kick_prepare() {
                    return Some(Action::Op(KernelOp::QueueNotify {
                        port: cfg.notify_port,
                        value: 0,
                    }));
                }
            }
        }
        None
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
