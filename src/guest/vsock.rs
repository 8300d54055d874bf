//! One end of an AF_VSOCK stream connection over the virtio transport
//! (`net/vmw_vsock/virtio_transport_common.c`, Linux 5.x), as the guest's
//! driver and the host's vhost-vsock side both run it: connection set-up
//! (REQUEST / RESPONSE), data (RW) within the peer's credit, credit
//! updates, shutdown and reset. It produces and consumes packet headers
//! (`hw::virtio_vsock::Hdr`); the queues they cross are the device's.
//!
//! [`VsockDriver`] is the guest's virtio-vsock driver around one
//! connection end (`net/vmw_vsock/virtio_transport.c`): the RX ring's
//! fill and refill, the send path into the TX ring with its kick, and the
//! RX and TX completion work. The world runs it for `net.device =
//! "virtio-vsock"` (docs/vcanal.md, "virtio-vsock").

use crate::engine::Time;
use crate::hw::virtio_vsock::{Credit, Hdr, Op, VirtioVsockDev, DEFAULT_BUF_SIZE, TYPE_STREAM};

/// `VIRTIO_VSOCK_SHUTDOWN_RCV`.
pub const SHUTDOWN_RCV: u32 = 1;
/// `VIRTIO_VSOCK_SHUTDOWN_SEND`.
pub const SHUTDOWN_SEND: u32 = 2;

/// A connection's state (`sk_state` as the transport sets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// REQUEST sent, no RESPONSE yet.
    Connecting,
    /// Data may flow.
    Established,
    /// The peer shut down both directions, or this end did.
    Closing,
    /// Reset.
    Closed,
}

/// One end of a stream connection.
#[derive(Clone, Debug)]
pub struct VsockConn {
    /// (cid, port) of this end.
    pub local: (u64, u32),
    /// (cid, port) of the peer.
    pub peer: (u64, u32),
    /// State.
    pub state: State,
    /// Credit.
    pub credit: Credit,
    /// The peer's shutdown flags.
    pub peer_shutdown: u32,
}

impl VsockConn {
    fn new(local: (u64, u32), peer: (u64, u32), state: State) -> Self {
        VsockConn {
            local,
            peer,
            state,
            credit: Credit::new(DEFAULT_BUF_SIZE),
            peer_shutdown: 0,
        }
    }

    /// A packet of `op` with `len` payload bytes from this end, stamped
    /// with its credit (`virtio_transport_send_pkt_info`).
    fn packet(&mut self, op: Op, len: u32, flags: u32) -> Hdr {
        let mut h = Hdr {
            src_cid: self.local.0,
            dst_cid: self.peer.0,
            src_port: self.local.1,
            dst_port: self.peer.1,
            len,
            ty: TYPE_STREAM,
            op,
            flags,
            buf_alloc: 0,
            fwd_cnt: 0,
        };
        self.credit.stamp(&mut h);
        h
    }

    /// `connect()`: the connection and its REQUEST.
    pub fn connect(local: (u64, u32), peer: (u64, u32)) -> (VsockConn, Hdr) {
        let mut c = VsockConn::new(local, peer, State::Connecting);
        let h = c.packet(Op::Request, 0, 0);
        (c, h)
    }

    /// A listener's answer to a REQUEST (`virtio_transport_recv_listen`):
    /// the new connection, established, and its RESPONSE.
    pub fn accept(req: &Hdr) -> Option<(VsockConn, Hdr)> {
        if req.op != Op::Request {
            return None;
        }
        let mut c = VsockConn::new(
            (req.dst_cid, req.dst_port),
            (req.src_cid, req.src_port),
            State::Established,
        );
        c.credit.peer_update(req);
        let h = c.packet(Op::Response, 0, 0);
        Some((c, h))
    }

    /// `send()` of `bytes`: the RW packet carrying as much as the credit
    /// allows (at most 64 KiB), or None if it allows nothing (the sender
    /// blocks until a credit update).
    pub fn send(&mut self, bytes: u32) -> Option<Hdr> {
        if self.state != State::Established || bytes == 0 {
            return None;
        }
        let n = self.credit.take(bytes);
        (n > 0).then(|| self.packet(Op::Rw, n, 0))
    }

    /// The application reads `bytes` (at most what is queued); a CREDIT
    /// UPDATE to send, if the transport's rule asks for one. Returns
    /// (bytes read, packet).
    pub fn recv(&mut self, bytes: u32) -> (u32, Option<Hdr>) {
        let n = bytes.min(self.credit.rx_bytes);
        if n == 0 {
            return (0, None);
        }
        let update = self.credit.consume(n);
        (n, update.then(|| self.packet(Op::CreditUpdate, 0, 0)))
    }

    /// `shutdown(SHUT_RDWR)`: the SHUTDOWN packet.
    pub fn shutdown(&mut self) -> Hdr {
        self.state = State::Closing;
        self.packet(Op::Shutdown, 0, SHUTDOWN_RCV | SHUTDOWN_SEND)
    }

    /// A packet from the peer (`virtio_transport_recv_pkt`): updates the
    /// state and credit; returns the reply the transport sends, if any.
    /// RW data beyond the receive buffer is dropped (false in `.1`).
    pub fn on_packet(&mut self, h: &Hdr) -> (Option<Hdr>, bool) {
        if (h.src_cid, h.src_port) != self.peer || (h.dst_cid, h.dst_port) != self.local {
            return (None, false);
        }
        self.credit.peer_update(h);
        match (self.state, h.op) {
            (State::Connecting, Op::Response) => {
                self.state = State::Established;
                (None, true)
            }
            (State::Connecting, _) => {
                // Anything else while connecting resets the connection.
                self.state = State::Closed;
                (Some(self.packet(Op::Rst, 0, 0)), false)
            }
            (_, Op::Rst) => {
                self.state = State::Closed;
                (None, true)
            }
            (State::Established, Op::Rw) => (None, self.credit.queue_rx(h.len)),
            (State::Established, Op::CreditRequest) => {
                (Some(self.packet(Op::CreditUpdate, 0, 0)), true)
            }
            (_, Op::CreditUpdate) => (None, true),
            (_, Op::Shutdown) => {
                self.peer_shutdown |= h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if self.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND {
                    // Both directions closed by the peer: reply with RST
                    // (`virtio_transport_close` after a full shutdown).
                    self.state = State::Closed;
                    return (Some(self.packet(Op::Rst, 0, 0)), true);
                }
                (None, true)
            }
            _ => (None, false),
        }
    }
}

/// The guest driver's costs (calibration `[vsock]`, `[guest]`).
#[derive(Clone, Copy, Debug, Default)]
pub struct VsockDriverCosts {
    /// Per packet sent: `virtio_transport_send_pkt_info` (allocation,
    /// header, `send_pkt_list`) and `virtio_transport_send_pkt_work`'s
    /// `virtqueue_add_sgs`, with the buffer's free on TX completion.
    pub tx_pkt: Time,
    /// Per RX buffer taken: `virtio_transport_rx_work`'s
    /// `virtqueue_get_buf` and `virtio_transport_recv_pkt` (socket lookup,
    /// lock, credit, queue or wake-up), with its refill.
    pub rx_pkt: Time,
    /// `memcpy_from_msg` per KiB of payload.
    pub copy_per_kib: Time,
}

/// Counters of the guest driver.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct VsockDriverCounters {
    pub pkts_sent: u64,
    pub bytes_sent: u64,
    pub rx_bufs: u64,
    pub tx_reclaimed: u64,
    pub kicks_tx: u64,
    pub kicks_rx: u64,
    /// send() found no credit (the sender sleeps until an update).
    pub credit_stalls: u64,
    /// send() found the TX ring full.
    pub ring_full: u64,
}

/// What one pass of the send path did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendPass {
    /// Payload bytes queued.
    pub bytes: u32,
    /// Guest CPU time it took.
    pub cost: Time,
    /// The TX queue wants a notification (`virtqueue_kick_prepare`).
    pub kick: bool,
    /// It stopped for want of credit or ring space: the sender sleeps.
    pub blocked: bool,
}

/// The guest's virtio-vsock driver with one stream connection (the
/// program's socket). The device's rings are passed in on every call: they
/// are the world's (`Devices::vsock`).
#[derive(Clone, Debug)]
pub struct VsockDriver {
    /// The connection end.
    pub conn: VsockConn,
    /// Costs.
    pub costs: VsockDriverCosts,
    /// RX buffers posted and not yet taken back (`rx_buf_nr`).
    pub rx_buf_nr: u16,
    /// The ring's capacity (`rx_buf_max_nr`).
    pub rx_buf_max_nr: u16,
    /// Counters.
    pub counters: VsockDriverCounters,
}

impl VsockDriver {
    /// `virtio_vsock_probe`: the RX ring filled and published (the device
    /// is not running yet, so the probe's notify is not delivered); the
    /// connection of `local` to `peer`, not yet requested.
    pub fn probe(
        dev: &mut VirtioVsockDev,
        local: (u64, u32),
        peer: (u64, u32),
        costs: VsockDriverCosts,
    ) -> (Self, Hdr) {
        let mut n = 0;
        while dev.post_rx_buffer() {
            n += 1;
        }
        let _ = dev.rx.kick_prepare();
        let (conn, req) = VsockConn::connect(local, peer);
        let d = VsockDriver {
            conn,
            costs,
            rx_buf_nr: n,
            rx_buf_max_nr: n,
            counters: VsockDriverCounters::default(),
        };
        (d, req)
    }

    /// Queues a control packet (REQUEST, CREDIT_UPDATE, RST) on TX:
    /// whether the TX queue wants a kick. False if the ring is full (the
    /// packet waits in `send_pkt_list` in Linux; here it is dropped, which
    /// the tests would see as a stalled stream).
    pub fn queue_control(&mut self, dev: &mut VirtioVsockDev, h: Hdr) -> bool {
        if !dev.send(h) {
            self.counters.ring_full += 1;
            return false;
        }
        self.counters.pkts_sent += 1;
        let kick = dev.tx.kick_prepare();
        self.counters.kicks_tx += u64::from(kick);
        kick
    }

    /// `virtio_transport_rx_work` then `virtio_transport_tx_work`: every
    /// used RX buffer goes to the transport (replies are queued on TX),
    /// the ring is refilled once fewer than half its buffers are posted
    /// (`rx_buf_nr < rx_buf_max_nr / 2`), and sent buffers are reclaimed;
    /// both queues' callbacks end enabled, so a buffer used after this
    /// interrupts. Returns (CPU time, RX kick, TX kick).
    pub fn completion_work(&mut self, dev: &mut VirtioVsockDev) -> (Time, bool, bool) {
        let c = self.costs;
        let mut cost = 0;
        let mut tx_kick = false;
        loop {
            dev.rx.disable_cb();
            while let Some(h) = dev.recv() {
                self.rx_buf_nr = self.rx_buf_nr.saturating_sub(1);
                self.counters.rx_bufs += 1;
                cost += c.rx_pkt;
                let (reply, _) = self.conn.on_packet(&h);
                if let Some(r) = reply {
                    cost += c.tx_pkt;
                    tx_kick |= self.queue_control(dev, r);
                }
            }
            if dev.rx.enable_cb() {
                break;
            }
        }
        let mut rx_kick = false;
        if self.rx_buf_nr < self.rx_buf_max_nr / 2 {
            // virtio_vsock_rx_fill, then virtqueue_kick.
            while dev.post_rx_buffer() {
                self.rx_buf_nr += 1;
            }
            rx_kick = dev.rx.kick_prepare();
            self.counters.kicks_rx += u64::from(rx_kick);
        }
        loop {
            dev.tx.disable_cb();
            while dev.tx.get_used().is_some() {
                self.counters.tx_reclaimed += 1;
            }
            if dev.tx.enable_cb() {
                break;
            }
        }
        (cost, rx_kick, tx_kick)
    }

    /// The send path of `send()` for up to `bytes`: one RW packet per
    /// credit grant (at most 64 KiB each), each copied and added to the TX
    /// ring; then the kick decision for what was added.
    pub fn send(&mut self, dev: &mut VirtioVsockDev, bytes: u32) -> SendPass {
        let c = self.costs;
        let mut p = SendPass::default();
        while p.bytes < bytes {
            if dev.tx.num_free() == 0 {
                self.counters.ring_full += 1;
                p.blocked = true;
                break;
            }
            let Some(h) = self.conn.send(bytes - p.bytes) else {
                self.counters.credit_stalls += 1;
                p.blocked = true;
                break;
            };
            let ok = dev.send(h);
            debug_assert!(ok, "a descriptor was free");
            p.bytes += h.len;
            p.cost += c.tx_pkt + c.copy_per_kib * u64::from(h.len) / 1024;
            self.counters.pkts_sent += 1;
            self.counters.bytes_sent += u64::from(h.len);
        }
        p.kick = dev.tx.kick_prepare();
        self.counters.kicks_tx += u64::from(p.kick);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::virtio_vsock::{
        rx_buffers_for, VirtioVsockDev, CID_HOST, MAX_PKT_BUF_SIZE, RX_BUF_PAYLOAD,
    };

    /// The guest (cid 3) connects to a host listener; the REQUEST crosses
    /// TX, the RESPONSE RX; then data flows.
    #[test]
    fn connect_accept_and_established() {
        let mut dev = VirtioVsockDev::new(64, true, 3).unwrap();
        let (mut g, req) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        assert!(g.send(100).is_none(), "no data before the RESPONSE");
        assert!(dev.send(req));
        dev.tx.kick_prepare();
        let req = dev.pop_tx().unwrap();
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        assert_eq!(h.peer, (3, 1025));
        assert!(dev.post_rx_buffer());
        dev.rx.kick_prepare();
        assert!(dev.fill_rx(resp));
        let resp = dev.recv().unwrap();
        assert_eq!(g.on_packet(&resp), (None, true));
        assert_eq!(g.state, State::Established);
        let d = g.send(1000).unwrap();
        assert_eq!(d.len, 1000);
        assert_eq!(h.on_packet(&d), (None, true));
        assert_eq!(h.recv(4096), (1000, None));
    }

    /// A 4 MiB stream from guest to host: never more than the host's
    /// buffer in flight, nothing dropped, and the host sends a credit
    /// update about every 3/4 of its buffer.
    #[test]
    fn a_stream_is_flow_controlled_by_credit() {
        let (mut g, req) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        g.on_packet(&resp);
        let total: u32 = 4 << 20;
        let (mut sent, mut read, mut updates, mut stalls) = (0u32, 0u32, 0, 0);
        while read < total {
            // The sender sends what credit allows.
            while sent < total {
                let Some(p) = g.send(total - sent) else {
                    stalls += 1;
                    break;
                };
                assert!(p.len <= MAX_PKT_BUF_SIZE);
                let (_, ok) = h.on_packet(&p);
                assert!(ok, "credit never lets data overrun the receiver");
                sent += p.len;
            }
            assert!(h.credit.rx_bytes <= DEFAULT_BUF_SIZE);
            // The reader drains 16 KiB at a time.
            let (n, upd) = h.recv(16 * 1024);
            read += n;
            if let Some(u) = upd {
                updates += 1;
                assert_eq!(u.op, Op::CreditUpdate);
                g.on_packet(&u);
            }
        }
        assert_eq!(sent, total);
        assert!(stalls > 0, "the sender ran out of credit");
        let per = DEFAULT_BUF_SIZE * 3 / 4;
        let expect = total / per;
        assert!(
            (expect.saturating_sub(2)..=expect + 2).contains(&updates),
            "{updates} updates for {total} bytes (about one per {per})"
        );
    }

    /// vhost-vsock puts a 64 KiB packet into the guest's 4 KiB buffers.
    #[test]
    fn a_full_packet_takes_sixteen_rx_buffers() {
        let (mut g, req) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        g.on_packet(&resp);
        let p = h.send(1 << 20).unwrap();
        assert_eq!(p.len, MAX_PKT_BUF_SIZE);
        assert_eq!(rx_buffers_for(p.len, RX_BUF_PAYLOAD), 16);
    }

    /// Shutdown of both directions is answered with RST; a packet of
    /// another connection is ignored; anything but RESPONSE while
    /// connecting resets.
    #[test]
    fn shutdown_reset_and_strangers() {
        let (mut g, req) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        let mut stranger = resp;
        stranger.src_port = 9;
        assert_eq!(g.on_packet(&stranger), (None, false));
        assert_eq!(g.state, State::Connecting);
        g.on_packet(&resp);
        let sd = g.shutdown();
        let (reply, _) = h.on_packet(&sd);
        assert_eq!(reply.map(|r| r.op), Some(Op::Rst));
        assert_eq!(h.state, State::Closed);
        let (mut g2, _) = VsockConn::connect((3, 1026), (CID_HOST, 5000));
        let mut rw = resp;
        rw.dst_port = 1026;
        rw.op = Op::Rw;
        let (reply, _) = g2.on_packet(&rw);
        assert_eq!(reply.map(|r| r.op), Some(Op::Rst));
        assert_eq!(g2.state, State::Closed);
    }
}
