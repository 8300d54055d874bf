//! A virtio-vsock device (virtio spec 1.1 §5.10) as guest memory holds it,
//! and the stream transport's rules both ends follow: the 44-byte packet
//! header and credit-based flow control.
//!
//! The device has three virtqueues: RX (host to guest; the driver posts
//! buffers of [`RX_BUF_PAYLOAD`] bytes plus a header, as Linux 5.x's
//! `virtio_vsock_rx_fill` does), TX (guest to host) and an event queue
//! (transport reset only). The back end is vhost-vsock in the host kernel
//! (`drivers/vhost/vsock.c`): a vhost worker that the guest kicks through
//! an ioeventfd and that signals the guest through an irqfd, the same
//! worker model as vhost-net (`hv::vhost`).
//!
//! Credit (`net/vmw_vsock/virtio_transport_common.c`): each side
//! advertises its receive buffer (`buf_alloc`) and how many bytes its
//! application has consumed (`fwd_cnt`) in every packet it sends; a sender
//! may have at most `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)` bytes in
//! flight. A receiver sends an explicit CREDIT_UPDATE when the space it
//! last advertised falls below [`MAX_PKT_BUF_SIZE`].
//!
//! The guest's driver and connection end on top of it are in
//! `guest::vsock`, the back end in `hv::vhost_vsock`; the world runs them
//! for `net.device = "virtio-vsock"` (`world::vsock`, docs/vcanal.md
//! "virtio-vsock").

use super::virtio::{VirtioError, Virtqueue};

/// `sizeof(struct virtio_vsock_hdr)`: le64 src_cid, le64 dst_cid, le32
/// src_port, le32 dst_port, le32 len, le16 type, le16 op, le32 flags,
/// le32 buf_alloc, le32 fwd_cnt.
pub const HDR_LEN: usize = 44;

/// `VIRTIO_VSOCK_DEFAULT_RX_BUF_SIZE`: payload bytes of each RX buffer the
/// guest driver posts (Linux 5.x).
pub const RX_BUF_PAYLOAD: u32 = 4096;

/// `VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`: the largest payload of one packet, and
/// the free-space threshold below which a receiver sends a credit update.
pub const MAX_PKT_BUF_SIZE: u32 = 64 * 1024;

/// `VIRTIO_VSOCK_DEFAULT_BUF_SIZE`: a socket's receive buffer
/// (`buf_alloc`) unless the application sets another.
pub const DEFAULT_BUF_SIZE: u32 = 256 * 1024;

/// `VIRTIO_VSOCK_MAX_BUF_SIZE`: the largest `buf_alloc` a socket accepts.
pub const MAX_BUF_SIZE: u32 = 0xFFFF_FFFF;

/// `VIRTIO_VSOCK_TYPE_STREAM`: the only socket type (no datagrams in the
/// Linux transport: `virtio_transport_dgram_enqueue` is EOPNOTSUPP).
pub const TYPE_STREAM: u16 = 1;

/// `VMADDR_CID_HOST`.
pub const CID_HOST: u64 = 2;

/// Packet operations (`enum virtio_vsock_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Connect.
    Request = 1,
    /// Connect accepted.
    Response = 2,
    /// Reset.
    Rst = 3,
    /// Half or full close (flags: RCV 1, SEND 2).
    Shutdown = 4,
    /// Data.
    Rw = 5,
    /// Credit update (no payload).
    CreditUpdate = 6,
    /// Ask the peer for a credit update.
    CreditRequest = 7,
}

impl Op {
    fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A packet header (`struct virtio_vsock_hdr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hdr {
    /// Source context id.
    pub src_cid: u64,
    /// Destination context id.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload bytes.
    pub len: u32,
    /// Socket type.
    pub ty: u16,
    /// Operation.
    pub op: Op,
    /// Operation flags.
    pub flags: u32,
    /// The sender's receive buffer.
    pub buf_alloc: u32,
    /// Bytes the sender's application has consumed.
    pub fwd_cnt: u32,
}

/// Why a header or a packet is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VsockError {
    /// Fewer than [`HDR_LEN`] bytes.
    #[error("vsock header: {0} bytes, need 44")]
    Short(usize),
    /// An operation the transport does not know.
    #[error("vsock header: unknown op {0}")]
    UnknownOp(u16),
    /// A type other than stream (`virtio_transport_recv_pkt` drops it).
    #[error("vsock header: type {0} is not stream")]
    NotStream(u16),
    /// A payload above [`MAX_PKT_BUF_SIZE`].
    #[error("vsock header: payload {0} above 64 KiB")]
    TooLong(u32),
}

impl Hdr {
    /// The little-endian bytes the device reads.
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.ty.to_le_bytes());
        b[30..32].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// Reads a header as the receiving transport checks it.
    pub fn decode(b: &[u8]) -> Result<Hdr, VsockError> {
        if b.len() < HDR_LEN {
            return Err(VsockError::Short(b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let ty = u16::from_le_bytes([b[28], b[29]]);
        let op_raw = u16::from_le_bytes([b[30], b[31]]);
        let op = Op::from_u16(op_raw).ok_or(VsockError::UnknownOp(op_raw))?;
        if ty != TYPE_STREAM {
            return Err(VsockError::NotStream(ty));
        }
        let len = u32_at(24);
        if len > MAX_PKT_BUF_SIZE {
            return Err(VsockError::TooLong(len));
        }
        Ok(Hdr {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len,
            ty,
            op,
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }
}

/// One connection's credit state at one end (`struct virtio_vsock_sock`).
/// Counters wrap as the kernel's u32s do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    /// This end's receive buffer.
    pub buf_alloc: u32,
    /// Bytes its application consumed.
    pub fwd_cnt: u32,
    /// `fwd_cnt` as last advertised to the peer.
    pub last_fwd_cnt: u32,
    /// Bytes queued for its application.
    pub rx_bytes: u32,
    /// Bytes it has sent.
    pub tx_cnt: u32,
    /// The peer's receive buffer, as last advertised.
    pub peer_buf_alloc: u32,
    /// The peer's consumed bytes, as last advertised.
    pub peer_fwd_cnt: u32,
}

impl Credit {
    /// A new socket with a receive buffer of `buf_alloc` (the peer's is
    /// unknown, so no credit, until its first packet).
    pub fn new(buf_alloc: u32) -> Self {
        Credit {
            buf_alloc,
            fwd_cnt: 0,
            last_fwd_cnt: 0,
            rx_bytes: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
        }
    }

    /// `virtio_transport_has_space`: bytes it may still send.
    pub fn space(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// `virtio_transport_get_credit`: takes up to `want` bytes of credit
    /// (one packet's payload, at most [`MAX_PKT_BUF_SIZE`]); 0 means the
    /// sender must wait for a credit update.
    pub fn take(&mut self, want: u32) -> u32 {
        let n = want.min(MAX_PKT_BUF_SIZE).min(self.space());
        self.tx_cnt = self.tx_cnt.wrapping_add(n);
        n
    }

    /// `virtio_transport_inc_tx_pkt`: every packet sent carries this end's
    /// buffer and consumed count (which counts as advertised).
    pub fn stamp(&mut self, h: &mut Hdr) {
        self.last_fwd_cnt = self.fwd_cnt;
        h.buf_alloc = self.buf_alloc;
        h.fwd_cnt = self.fwd_cnt;
    }

    /// `virtio_transport_space_update`: a packet from the peer updates what
    /// this end knows of its buffer.
    pub fn peer_update(&mut self, h: &Hdr) {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
    }

    /// `virtio_transport_inc_rx_pkt`: queues `len` received bytes; false
    /// (the packet is dropped) if they do not fit the buffer.
    pub fn queue_rx(&mut self, len: u32) -> bool {
        if u64::from(self.rx_bytes) + u64::from(len) > u64::from(self.buf_alloc) {
            return false;
        }
        self.rx_bytes += len;
        true
    }

    /// The application consumed `len` queued bytes
    /// (`virtio_transport_dec_rx_pkt`). Returns whether this end must send
    /// a credit update (`virtio_transport_stream_do_dequeue`): the bytes
    /// consumed since its last advertisement leave less than
    /// [`MAX_PKT_BUF_SIZE`] of its buffer. A sender stalled on a full
    /// buffer thus waits until the reader has drained 3/4 of it (256 KiB
    /// default).
    pub fn consume(&mut self, len: u32) -> bool {
        let len = len.min(self.rx_bytes);
        self.rx_bytes -= len;
        self.fwd_cnt = self.fwd_cnt.wrapping_add(len);
        let advertised_used = self.fwd_cnt.wrapping_sub(self.last_fwd_cnt);
        self.buf_alloc.saturating_sub(advertised_used) < MAX_PKT_BUF_SIZE
    }
}

/// How vhost-vsock fills the guest's RX buffers with a packet of `len`
/// payload bytes (`vhost_transport_do_send_pkt`): each buffer takes a
/// header and up to `buf_payload` bytes, the rest goes in the next buffer.
/// Returns the number of RX buffers used.
pub fn rx_buffers_for(len: u32, buf_payload: u32) -> u32 {
    len.div_ceil(buf_payload.max(1)).max(1)
}

/// One virtio-vsock device: its three virtqueues and the packet header of
/// each descriptor chain in flight.
#[derive(Clone, Debug)]
pub struct VirtioVsockDev {
    /// Host to guest.
    pub rx: Virtqueue,
    /// Guest to host.
    pub tx: Virtqueue,
    /// Transport events.
    pub event: Virtqueue,
    rx_hdrs: Vec<Option<Hdr>>,
    tx_hdrs: Vec<Option<Hdr>>,
    /// The guest's context id.
    pub guest_cid: u64,
}

impl VirtioVsockDev {
    /// A device of queues of `size` entries for guest `guest_cid` (> 2).
    pub fn new(size: u16, event_idx: bool, guest_cid: u64) -> Result<Self, VirtioError> {
        Ok(VirtioVsockDev {
            rx: Virtqueue::new(size, event_idx)?,
            tx: Virtqueue::new(size, event_idx)?,
            event: Virtqueue::new(size.min(8), event_idx)?,
            rx_hdrs: vec![None; size as usize],
            tx_hdrs: vec![None; size as usize],
            guest_cid,
        })
    }

    // ---- driver side (the guest's virtio_transport) ----

    /// `virtio_vsock_rx_fill`: posts one RX buffer (header + 4 KiB).
    pub fn post_rx_buffer(&mut self) -> bool {
        self.rx
            .add_buf(HDR_LEN as u32 + RX_BUF_PAYLOAD, true)
            .is_ok()
    }

    /// Queues a packet for the host (header and payload, one chain).
    pub fn send(&mut self, h: Hdr) -> bool {
        match self.tx.add_buf(HDR_LEN as u32 + h.len, false) {
            Ok(head) => {
                self.tx_hdrs[head as usize] = Some(h);
                true
            }
            Err(_) => false,
        }
    }

    /// A packet the host filled in, if any.
    pub fn recv(&mut self) -> Option<Hdr> {
        let (head, _) = self.rx.get_used()?;
        self.rx_hdrs[head as usize].take()
    }

    /// Payload bytes of the packets the driver queued on TX that the
    /// device has not taken yet.
    pub fn tx_bytes_queued(&self) -> u64 {
        self.tx_hdrs
            .iter()
            .flatten()
            .map(|h| u64::from(h.len))
            .sum()
    }

    // ---- device side (vhost-vsock) ----

    /// `vhost_vsock_handle_tx_kick`: the next packet the guest sent.
    pub fn pop_tx(&mut self) -> Option<Hdr> {
        let (head, _) = self.tx.pop_avail()?;
        let h = self.tx_hdrs[head as usize].take();
        self.tx.push_used(head, 0);
        h
    }

    /// Fills one guest RX buffer with `h` (its payload at most
    /// [`RX_BUF_PAYLOAD`]); false with no buffer posted (the packet waits
    /// in the host's queue, `vhost_transport_do_send_pkt`).
    pub fn fill_rx(&mut self, h: Hdr) -> bool {
        debug_assert!(h.len <= RX_BUF_PAYLOAD);
        let Some((head, _)) = self.rx.pop_avail() else {
            return false;
        };
        self.rx_hdrs[head as usize] = Some(h);
        self.rx.push_used(head, HDR_LEN as u32 + h.len);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(op: Op, len: u32) -> Hdr {
        Hdr {
            src_cid: 3,
            dst_cid: CID_HOST,
            src_port: 1024,
            dst_port: 80,
            len,
            ty: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        }
    }

    #[test]
    fn a_header_is_44_little_endian_bytes_and_round_trips() {
        let mut h = hdr(Op::Rw, 4096);
        h.buf_alloc = DEFAULT_BUF_SIZE;
        h.fwd_cnt = 0x0102_0304;
        let b = h.encode();
        assert_eq!(b.len(), 44);
        assert_eq!(&b[24..28], &4096u32.to_le_bytes());
        assert_eq!(&b[30..32], &5u16.to_le_bytes());
        assert_eq!(&b[40..44], &[4, 3, 2, 1]);
        assert_eq!(Hdr::decode(&b), Ok(h));
    }

    #[test]
    fn bad_headers_are_refused() {
        let h = hdr(Op::Rw, 10);
        assert_eq!(Hdr::decode(&h.encode()[..43]), Err(VsockError::Short(43)));
        let mut b = h.encode();
        b[30] = 9;
        assert_eq!(Hdr::decode(&b), Err(VsockError::UnknownOp(9)));
        let mut b = h.encode();
        b[28] = 2; // SEQPACKET, not in the 5.x transport
        assert_eq!(Hdr::decode(&b), Err(VsockError::NotStream(2)));
        let mut b = h.encode();
        b[24..28].copy_from_slice(&(MAX_PKT_BUF_SIZE + 1).to_le_bytes());
        assert!(matches!(Hdr::decode(&b), Err(VsockError::TooLong(_))));
    }

    /// A sender has no credit until the peer advertises its buffer, then
    /// at most that buffer in flight; consumed bytes return it.
    #[test]
    fn credit_bounds_the_bytes_in_flight() {
        let mut tx = Credit::new(DEFAULT_BUF_SIZE);
        let mut rx = Credit::new(DEFAULT_BUF_SIZE);
        assert_eq!(tx.take(1000), 0, "no credit before the peer's first packet");
        let mut resp = hdr(Op::Response, 0);
        rx.stamp(&mut resp);
        tx.peer_update(&resp);
        let mut sent = 0;
        loop {
            let n = tx.take(100_000);
            if n == 0 {
                break;
            }
            assert!(n <= MAX_PKT_BUF_SIZE);
            assert!(rx.queue_rx(n), "credit never overruns the receiver");
            sent += n;
        }
        assert_eq!(sent, DEFAULT_BUF_SIZE);
        assert!(
            !rx.queue_rx(1),
            "a full buffer drops what credit did not allow"
        );
        // Linux counts only what was consumed since the last advertisement
        // (buf_alloc - (fwd_cnt - last_fwd_cnt) < 64 KiB): reading 64 KiB
        // of a stalled sender's 256 KiB sends nothing yet...
        assert!(!rx.consume(64 * 1024));
        assert!(!rx.consume(128 * 1024));
        // ...past 192 KiB it does.
        assert!(rx.consume(1), "192 KiB + 1 consumed unadvertised: update");
        let mut upd = hdr(Op::CreditUpdate, 0);
        rx.stamp(&mut upd);
        tx.peer_update(&upd);
        assert_eq!(tx.space(), 192 * 1024 + 1);
        // Small reads right after an update do not send another.
        assert!(!rx.consume(1024));
    }

    #[test]
    fn credit_counters_wrap_like_u32() {
        let mut c = Credit::new(DEFAULT_BUF_SIZE);
        c.tx_cnt = u32::MAX - 10;
        c.peer_fwd_cnt = u32::MAX - 10;
        c.peer_buf_alloc = 100;
        assert_eq!(c.take(50), 50);
        assert_eq!(c.take(100), 50, "tx_cnt wrapped past 0");
        assert_eq!(c.space(), 0);
    }

    #[test]
    fn a_64k_packet_fills_sixteen_4k_rx_buffers() {
        assert_eq!(rx_buffers_for(MAX_PKT_BUF_SIZE, RX_BUF_PAYLOAD), 16);
        assert_eq!(rx_buffers_for(1, RX_BUF_PAYLOAD), 1);
        assert_eq!(rx_buffers_for(0, RX_BUF_PAYLOAD), 1, "a credit update");
        assert_eq!(rx_buffers_for(4097, RX_BUF_PAYLOAD), 2);
    }

    /// Packets cross the queues in order; the host cannot fill RX buffers
    /// the guest has not posted.
    #[test]
    fn packets_cross_the_virtqueues() {
        let mut d = VirtioVsockDev::new(8, true, 3).unwrap();
        assert!(d.send(hdr(Op::Request, 0)));
        assert!(d.send(hdr(Op::Rw, 100)));
        assert!(d.tx.kick_prepare());
        assert_eq!(d.pop_tx().map(|h| h.op), Some(Op::Request));
        assert_eq!(d.pop_tx().map(|h| h.len), Some(100));
        assert_eq!(d.pop_tx(), None);
        let mut resp = hdr(Op::Response, 0);
        std::mem::swap(&mut resp.src_cid, &mut resp.dst_cid);
        assert!(!d.fill_rx(resp), "no RX buffer posted yet");
        assert!(d.post_rx_buffer());
        d.rx.kick_prepare();
        assert!(d.fill_rx(resp));
        assert_eq!(d.recv(), Some(resp));
        assert_eq!(d.recv(), None);
    }
}
