//! A virtio-blk device as guest memory holds it: one request virtqueue and
//! the request headers its descriptors point at (type, sector, length).
//! The driver (guest) adds requests and the back end (QEMU's virtio-blk
//! with an ioeventfd, in the host) returns them with a status.

use super::virtio::{VirtioError, Virtqueue};
use crate::engine::Time;

/// One block request as the driver wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkRequest {
    /// VIRTIO_BLK_T_OUT (write) rather than VIRTIO_BLK_T_IN (read).
    pub write: bool,
    /// First 512-byte sector.
    pub sector: u64,
    /// Bytes.
    pub len: u32,
    /// When the application issued it (for completion latency).
    pub issued: Time,
}

/// One virtio-blk device.
#[derive(Clone, Debug)]
pub struct VirtioBlkDev {
    vq: Virtqueue,
    reqs: Vec<BlkRequest>,
    /// The request queue's notify port.
    pub notify_port: u16,
}

impl VirtioBlkDev {
    /// A device with a request queue of `size` entries.
    pub fn new(size: u16, event_idx: bool, notify_port: u16) -> Result<Self, VirtioError> {
        Ok(VirtioBlkDev {
            vq: Virtqueue::new(size, event_idx)?,
            reqs: vec![BlkRequest::default(); size as usize],
            notify_port,
        })
    }

    // ---- driver side ----

    /// Adds a request; false when the queue is full.
    pub fn add(&mut self, r: BlkRequest) -> bool {
        match self.vq.add_buf(r.len, !r.write) {
            Ok(head) => {
                self.reqs[head as usize] = r;
                true
            }
            Err(_) => false,
        }
    }

    /// Publishes added requests; true if the device must be notified.
    pub fn kick_prepare(&mut self) -> bool {
        self.vq.kick_prepare()
    }

    /// Takes the next completed request.
    pub fn get_done(&mut self) -> Option<BlkRequest> {
        let (head, _) = self.vq.get_used()?;
        Some(self.reqs[head as usize])
    }

    /// `virtqueue_disable_cb`.
    pub fn disable_cb(&mut self) {
        self.vq.disable_cb();
    }

    /// `virtqueue_enable_cb`; false if completions are already waiting.
    pub fn enable_cb(&mut self) -> bool {
        self.vq.enable_cb()
    }

    // ---- device side ----

    /// Takes the next request the driver made available.
    pub fn pop(&mut self) -> Option<(u16, BlkRequest)> {
        let (head, _) = self.vq.pop_avail()?;
        Some((head, self.reqs[head as usize]))
    }

    /// Completes request `head` (status OK; reads return `len` bytes).
    pub fn complete(&mut self, head: u16) {
        let r = self.reqs[head as usize];
        self.vq.push_used(head, if r.write { 1 } else { r.len + 1 });
    }

    /// Whether the driver asked to be interrupted now.
    pub fn need_signal(&mut self) -> bool {
        self.vq.need_signal()
    }

    /// Suppress kicks while processing.
    pub fn disable_notify(&mut self) {
        self.vq.disable_notify();
    }

    /// Re-enable kicks; true if requests slipped in meanwhile.
    pub fn enable_notify(&mut self) -> bool {
        self.vq.enable_notify()
    }
}
