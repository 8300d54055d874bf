//! A virtio-net device as guest memory holds it: an RX and a TX split
//! virtqueue ([`super::virtio`]) and the buffers their descriptors point at.
//! The front-end driver (guest) and the back end (vhost, in the host) both
//! work on this memory; neither calls the other. Kicks and interrupts travel
//! separately (a PIO write to the notify port, an irqfd).
//!
//! Methods are named for the side that uses them: `rx_add_buffer`,
//! `rx_get`, `tx_add`, ... for the driver; `tx_pop`, `rx_fill`, ... for the
//! device.

use super::virtio::{SplitRing, VirtioError, Virtqueue};
use super::wire::Frame;

/// Queue index of the receive queue.
pub const RX_QUEUE: u16 = 0;
/// Queue index of the transmit queue.
pub const TX_QUEUE: u16 = 1;

/// Receive buffer: Linux 3.6's "big packets" mode (GUEST_TSO4
/// negotiated, mergeable buffers not modelled): `add_recvbuf_big` posts a
/// chain of MAX_SKB_FRAGS + 1 pages per buffer, one ring entry (indirect
/// descriptors), so one buffer takes a whole GSO packet.
const RX_BUFFER_BYTES: u32 = 18 * 4096;

/// One virtio-net device.
#[derive(Clone, Debug)]
pub struct VirtioNetDev {
    rx: Virtqueue,
    tx: Virtqueue,
    /// Buffer memory of the RX queue, by descriptor index.
    rx_bufs: Vec<Frame>,
    /// Buffer memory of the TX queue, by descriptor index.
    tx_bufs: Vec<Frame>,
    /// The notify port of queue 0 (queue q at `notify_port + q`).
    pub notify_port: u16,
    size: u16,
}

impl VirtioNetDev {
    /// A device with two queues of `size` entries.
    pub fn new(size: u16, event_idx: bool, notify_port: u16) -> Result<Self, VirtioError> {
        Ok(VirtioNetDev {
            rx: Virtqueue::new(size, event_idx)?,
            tx: Virtqueue::new(size, event_idx)?,
            rx_bufs: vec![Frame::default(); size as usize],
            tx_bufs: vec![Frame::default(); size as usize],
            notify_port,
            size,
        })
    }

    /// Entries per queue.
    pub fn queue_size(&self) -> u16 {
        self.size
    }

    /// The RX queue's ring, as guest memory holds it.
    pub fn rx_ring(&self) -> &SplitRing {
        &self.rx.ring
    }

    /// The TX queue's ring.
    pub fn tx_ring(&self) -> &SplitRing {
        &self.tx.ring
    }

    // ---- driver side ----

    /// Posts one empty receive buffer; false when the ring is full.
    pub fn rx_add_buffer(&mut self) -> bool {
        self.rx.add_buf(RX_BUFFER_BYTES, true).is_ok()
    }

    /// Receive buffers posted and not yet returned.
    pub fn rx_outstanding(&self) -> u16 {
        self.size - self.rx.num_free()
    }

    /// Publishes posted buffers; true if the device must be notified.
    pub fn rx_kick_prepare(&mut self) -> bool {
        self.rx.kick_prepare()
    }

    /// Takes the next filled receive buffer's frame.
    pub fn rx_get(&mut self) -> Option<Frame> {
        let (id, _len) = self.rx.get_used()?;
        Some(self.rx_bufs[id as usize])
    }

    /// `virtqueue_disable_cb` on RX.
    pub fn rx_disable_cb(&mut self) {
        self.rx.disable_cb();
    }

    /// `virtqueue_enable_cb` on RX; false if used buffers are already
    /// waiting (the caller must poll again).
    pub fn rx_enable_cb(&mut self) -> bool {
        self.rx.enable_cb()
    }

    /// Returns transmitted buffers to the free list; how many.
    pub fn tx_reclaim(&mut self) -> u32 {
        let mut n = 0;
        while self.tx.get_used().is_some() {
            n += 1;
        }
        n
    }

    /// Adds a frame to the TX queue; false when the ring is full.
    pub fn tx_add(&mut self, f: Frame) -> bool {
        match self.tx.add_buf(f.len(), false) {
            Ok(head) => {
                self.tx_bufs[head as usize] = f;
                true
            }
            Err(_) => false,
        }
    }

    /// Publishes added frames; true if the device must be notified.
    pub fn tx_kick_prepare(&mut self) -> bool {
        self.tx.kick_prepare()
    }

    /// `virtqueue_disable_cb` on TX.
    pub fn tx_disable_cb(&mut self) {
        self.tx.disable_cb();
    }

    /// `virtqueue_enable_cb_delayed` on TX; false if enough buffers are
    /// already used.
    pub fn tx_enable_cb_delayed(&mut self) -> bool {
        self.tx.enable_cb_delayed()
    }

    // ---- device side ----

    /// Takes the next frame the driver made available on TX.
    pub fn tx_pop(&mut self) -> Option<(u16, Frame)> {
        let (head, _len) = self.tx.pop_avail()?;
        Some((head, self.tx_bufs[head as usize]))
    }

    /// Returns a transmitted buffer to the driver.
    pub fn tx_complete(&mut self, head: u16) {
        self.tx.push_used(head, 0);
    }

    /// Whether the driver asked to be interrupted for TX completions now.
    pub fn tx_need_signal(&mut self) -> bool {
        self.tx.need_signal()
    }

    /// Suppress TX kicks while the device is processing.
    pub fn tx_disable_notify(&mut self) {
        self.tx.disable_notify();
    }

    /// Keep TX kicks off until re-enabled (a polling back end).
    pub fn tx_suppress_notify(&mut self) {
        self.tx.suppress_notify();
    }

    /// Re-enable TX kicks; true if buffers slipped in meanwhile.
    pub fn tx_enable_notify(&mut self) -> bool {
        self.tx.enable_notify()
    }

    /// Takes the next empty receive buffer the driver posted.
    pub fn rx_pop_buffer(&mut self) -> Option<u16> {
        self.rx.pop_avail().map(|(head, _)| head)
    }

    /// Writes a frame into receive buffer `head` and returns it used.
    pub fn rx_fill(&mut self, head: u16, f: Frame) {
        self.rx_bufs[head as usize] = f;
        self.rx.push_used(head, f.len());
    }

    /// Whether the driver asked to be interrupted for RX now.
    pub fn rx_need_signal(&mut self) -> bool {
        self.rx.need_signal()
    }

    /// Suppress RX kicks (refill notifications).
    pub fn rx_disable_notify(&mut self) {
        self.rx.disable_notify();
    }

    /// Re-enable RX kicks; true if buffers were posted meanwhile.
    pub fn rx_enable_notify(&mut self) -> bool {
        self.rx.enable_notify()
    }
}
