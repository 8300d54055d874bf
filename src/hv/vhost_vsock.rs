//! vhost-vsock: the in-kernel back end of a virtio-vsock device
//! (`drivers/vhost/vsock.c`, Linux 5.x), and the host-side relay a
//! deployment needs to reach the network from a vsock socket.
//!
//! The back end has two handlers, as vhost-net has:
//!
//! * **TX** (`vhost_vsock_handle_tx_kick`): queued by the guest's kick on
//!   the TX queue's ioeventfd. With kicks off it takes every available
//!   packet up to `VHOST_VSOCK_PKT_WEIGHT` packets or `VHOST_VSOCK_WEIGHT`
//!   bytes, hands each to the host's socket layer
//!   (`virtio_transport_recv_pkt`), returns the buffer to the used ring and
//!   signals the guest if its EVENT_IDX asks (`vhost_signal` → irqfd). An
//!   empty ring turns kicks back on and is looked at once more, so a kick
//!   is never lost (`vhost_enable_notify`).
//! * **RX** (`vhost_transport_send_pkt_work`): queued when the host side
//!   queues a packet for the guest (a RESPONSE, a CREDIT_UPDATE, data).
//!   Each packet takes one guest RX buffer per 4 KiB of payload
//!   ([`rx_buffers_for`]); out of buffers, the packet stays queued and the
//!   handler waits for the guest's refill kick.
//!
//! The world runs it for `net.device = "virtio-vsock"` (`world::vsock`,
//! docs/vcanal.md "virtio-vsock").

use crate::engine::Time;
use crate::guest::vsock::{State, VsockConn};
use crate::hw::virtio_vsock::{Hdr, Op, VirtioVsockDev, RX_BUF_PAYLOAD};
use std::collections::VecDeque;

/// `VHOST_VSOCK_WEIGHT`: bytes one handler run may move before requeueing.
pub const VHOST_VSOCK_WEIGHT: u64 = 0x80000;
/// `VHOST_VSOCK_PKT_WEIGHT`: packets one handler run may move.
pub const VHOST_VSOCK_PKT_WEIGHT: u32 = 256;

/// Costs of the back end. The world takes them from the calibration file
/// once the path is wired; here they are the caller's.
#[derive(Clone, Copy, Debug, Default)]
pub struct VsockCosts {
    /// Per packet on TX: descriptor, header parse, socket lookup.
    pub tx_per_pkt: Time,
    /// Per packet on RX: descriptor, header write.
    pub rx_per_pkt: Time,
    /// Copy per KiB of payload (either direction).
    pub copy_per_kib: Time,
    /// `vhost_signal` → eventfd → irqfd injection request.
    pub signal: Time,
}

/// Which queue a kick or a handler is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VsockVq {
    /// Host to guest (queue 0).
    Rx = 0,
    /// Guest to host (queue 1).
    Tx = 1,
}

/// Counters of one back end.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct VsockCounters {
    pub kicks: u64,
    pub tx_pkts: u64,
    pub tx_bytes: u64,
    pub rx_pkts: u64,
    pub rx_buffers: u64,
    pub signals: u64,
    pub signals_suppressed: u64,
    /// RX turns that stopped for want of guest buffers.
    pub rx_no_buffer: u64,
    /// TX turns that stopped at a weight and requeued.
    pub requeues: u64,
    /// Packets for a port nobody listens on, answered with RST.
    pub resets: u64,
    /// RW packets the host socket dropped for want of buffer (a sender
    /// past its credit; never with a correct transport).
    pub dropped: u64,
    /// Packets off the TX ring not addressed from this device's guest CID
    /// to the host, dropped unread (`vhost_vsock_handle_tx_kick`).
    pub misaddressed: u64,
}

/// What one handler turn did, for the platform to carry out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// Worker time the turn took (signal included).
    pub cost: Time,
    /// Packets moved.
    pub pkts: u32,
    /// Raise the guest's interrupt for this queue (irqfd).
    pub signal: bool,
    /// The handler stopped at a weight and must run again.
    pub requeue: bool,
    /// The RX handler has packets for the guest queued (`send_pkt_list`).
    pub rx_pending: bool,
}

/// The back end of one virtio-vsock device, with the host socket its
/// listener accepted.
#[derive(Clone, Debug)]
pub struct VhostVsock {
    /// The VM it serves.
    pub vm: usize,
    /// Ioeventfd of each queue's notify (RX, TX).
    pub kick_fd: [u16; 2],
    /// The host port a listener waits on.
    pub listen_port: u32,
    /// The host end of the guest's connection, once accepted.
    pub conn: Option<VsockConn>,
    /// `send_pkt_list`: packets for the guest.
    pub send_pkt: VecDeque<Hdr>,
    /// Host sockets that connected to the guest (relay processes'
    /// `connect()` to a guest listener), by slot; empty unless a relay
    /// connects.
    pub socks: Vec<Option<VsockConn>>,
    /// Counters.
    pub counters: VsockCounters,
    /// The guest CID of the device it serves, when set: packets from any
    /// other source CID are dropped.
    pub guest_cid: Option<u64>,
}

impl VhostVsock {
    /// The back end of `vm`'s device; a host listener on `listen_port`.
    pub fn new(vm: usize, kick_fd: [u16; 2], listen_port: u32) -> Self {
        VhostVsock {
            vm,
            kick_fd,
            listen_port,
            conn: None,
            send_pkt: VecDeque::with_capacity(64),
            socks: Vec::new(),
            counters: VsockCounters::default(),
            guest_cid: None,
        }
    }

    /// Accepts from the TX ring only packets from `cid` to the host
    /// (`VHOST_VSOCK_SET_GUEST_CID`; `vhost_vsock_handle_tx_kick` frees
    /// any other packet unread, so a guest cannot speak as another VM).
    pub fn with_guest_cid(mut self, cid: u64) -> Self {
        self.guest_cid = Some(cid);
        self
    }

    /// Room for `n` host sockets that connect to the guest.
    pub fn with_sockets(mut self, n: usize) -> Self {
        self.socks = vec![None; n];
        self.send_pkt.reserve(4 * n);
        self
    }

    /// `connect()` of a host socket on `local_port` to the guest's
    /// (`cid`, `port`) (`vsock_connect` → `virtio_transport_connect`): the
    /// socket's slot, its REQUEST queued for the guest (the caller queues
    /// the RX handler). None if every slot is taken.
    pub fn connect(&mut self, local_port: u32, cid: u64, port: u32) -> Option<usize> {
        let i = self.socks.iter().position(|s| s.is_none())?;
        let (c, req) =
            VsockConn::connect((crate::hw::virtio_vsock::CID_HOST, local_port), (cid, port));
        self.socks[i] = Some(c);
        self.send_pkt.push_back(req);
        Some(i)
    }

    /// `close()` of host socket `i` (`virtio_transport_close`): its RST or
    /// SHUTDOWN goes to the guest; the slot is freed once the connection
    /// is closed (at once after an RST, on the guest's RST after a
    /// SHUTDOWN: [`Self::reap`]).
    pub fn close(&mut self, i: usize) {
        let Some(c) = self.socks.get_mut(i).and_then(|s| s.as_mut()) else {
            return;
        };
        if let Some(h) = c.close() {
            self.send_pkt.push_back(h);
        }
        if c.state == State::Closed {
            self.socks[i] = None;
        }
    }

    /// Frees host socket `i` if its connection is closed.
    pub fn reap(&mut self, i: usize) {
        if self
            .socks
            .get(i)
            .and_then(|s| s.as_ref())
            .is_some_and(|c| c.state == State::Closed)
        {
            self.socks[i] = None;
        }
    }

    /// Host sockets in use.
    pub fn sockets_open(&self) -> usize {
        self.socks.iter().filter(|s| s.is_some()).count()
    }

    /// Which handler eventfd `fd` queues, if it is one of this device's.
    pub fn kicked(&mut self, fd: u16) -> Option<VsockVq> {
        let q = self.kick_fd.iter().position(|&k| k == fd)?;
        self.counters.kicks += 1;
        Some(if q == 0 { VsockVq::Rx } else { VsockVq::Tx })
    }

    /// `virtio_transport_recv_pkt` on the host: one packet from the guest.
    /// Replies go on `send_pkt`.
    fn deliver(&mut self, h: &Hdr) {
        let ours = |c: &VsockConn| {
            c.state != State::Closed
                && c.peer == (h.src_cid, h.src_port)
                && c.local == (h.dst_cid, h.dst_port)
        };
        let reply = match &mut self.conn {
            Some(c) if ours(c) => {
                let (reply, ok) = c.on_packet(h);
                if !ok && h.op == Op::Rw {
                    self.counters.dropped += 1;
                }
                reply
            }
            _ if self.socks.iter().flatten().any(ours) => {
                let c = self
                    .socks
                    .iter_mut()
                    .flatten()
                    .find(|c| ours(c))
                    .expect("found");
                let (reply, ok) = c.on_packet(h);
                if !ok && h.op == Op::Rw {
                    self.counters.dropped += 1;
                }
                reply
            }
            _ if h.op == Op::Request && h.dst_port == self.listen_port => {
                VsockConn::accept(h).map(|(c, resp)| {
                    self.conn = Some(c);
                    resp
                })
            }
            // No socket: `virtio_transport_reset_no_sock`.
            _ if h.op != Op::Rst => {
                self.counters.resets += 1;
                Some(Hdr {
                    src_cid: h.dst_cid,
                    dst_cid: h.src_cid,
                    src_port: h.dst_port,
                    dst_port: h.src_port,
                    len: 0,
                    op: Op::Rst,
                    flags: 0,
                    buf_alloc: 0,
                    fwd_cnt: 0,
                    ..*h
                })
            }
            _ => None,
        };
        if let Some(r) = reply {
            self.send_pkt.push_back(r);
        }
    }

    /// A packet the host side sends the guest (`vhost_transport_send_pkt`);
    /// the caller queues the RX handler.
    pub fn queue_for_guest(&mut self, h: Hdr) {
        self.send_pkt.push_back(h);
    }

    fn signal_if(&mut self, need: bool) -> bool {
        if need {
            self.counters.signals += 1;
        } else {
            self.counters.signals_suppressed += 1;
        }
        need
    }

    /// One turn of the TX handler.
    pub fn handle_tx(&mut self, dev: &mut VirtioVsockDev, c: &VsockCosts) -> Turn {
        self.handle_tx_seen(dev, c, |_| {})
    }

    /// [`Self::handle_tx`], showing `seen` each packet as the host's socket
    /// layer receives it (a packet trace, for tests and metrics).
    pub fn handle_tx_seen(
        &mut self,
        dev: &mut VirtioVsockDev,
        c: &VsockCosts,
        mut seen: impl FnMut(&Hdr),
    ) -> Turn {
        let mut t = Turn::default();
        let mut bytes = 0u64;
        dev.tx.disable_notify();
        loop {
            let Some(h) = dev.pop_tx() else {
                // `vhost_enable_notify`: look once more after turning kicks
                // back on.
                if dev.tx.enable_notify() {
                    dev.tx.disable_notify();
                    continue;
                }
                break;
            };
            t.pkts += 1;
            bytes += u64::from(h.len);
            self.counters.tx_pkts += 1;
            self.counters.tx_bytes += u64::from(h.len);
            t.cost += c.tx_per_pkt + c.copy_per_kib * u64::from(h.len) / 1024;
            let addressed = self.guest_cid.is_none_or(|cid| {
                h.src_cid == cid && h.dst_cid == crate::hw::virtio_vsock::CID_HOST
            });
            if addressed {
                self.deliver(&h);
                seen(&h);
            } else {
                self.counters.misaddressed += 1;
            }
            if t.pkts >= VHOST_VSOCK_PKT_WEIGHT || bytes >= VHOST_VSOCK_WEIGHT {
                // `vhost_exceeds_weight`: requeue, kicks stay off.
                self.counters.requeues += 1;
                t.requeue = true;
                break;
            }
        }
        if t.pkts > 0 {
            t.signal = self.signal_if(dev.tx.need_signal());
            if t.signal {
                t.cost += c.signal;
            }
        }
        t.rx_pending = !self.send_pkt.is_empty();
        t
    }

    /// One turn of the RX handler (`vhost_transport_do_send_pkt`): packets
    /// from `send_pkt` into guest buffers, a large one split over several
    /// ([`crate::hw::virtio_vsock::rx_buffers_for`] of them).
    pub fn handle_rx(&mut self, dev: &mut VirtioVsockDev, c: &VsockCosts) -> Turn {
        let mut t = Turn::default();
        let mut bytes = 0u64;
        let mut bufs = 0u32;
        dev.rx.disable_notify();
        while let Some(h) = self.send_pkt.front_mut() {
            if !dev.rx.has_avail() {
                // `vhost_enable_notify`: the guest's next refill kicks.
                if dev.rx.enable_notify() {
                    dev.rx.disable_notify();
                    continue;
                }
                self.counters.rx_no_buffer += 1;
                break;
            }
            // One buffer takes the header and up to 4 KiB; the rest of the
            // packet stays at the head of the list (`pkt->off`).
            let part = h.len.min(RX_BUF_PAYLOAD);
            let filled = dev.fill_rx(Hdr { len: part, ..*h });
            debug_assert!(filled, "a buffer was available");
            h.len -= part;
            bufs += 1;
            bytes += u64::from(part);
            self.counters.rx_buffers += 1;
            t.cost += c.rx_per_pkt + c.copy_per_kib * u64::from(part) / 1024;
            if h.len == 0 {
                self.send_pkt.pop_front();
                t.pkts += 1;
                self.counters.rx_pkts += 1;
            }
            if bufs >= VHOST_VSOCK_PKT_WEIGHT || bytes >= VHOST_VSOCK_WEIGHT {
                self.counters.requeues += 1;
                t.requeue = !self.send_pkt.is_empty();
                break;
            }
        }
        if bufs > 0 {
            t.signal = self.signal_if(dev.rx.need_signal());
            if t.signal {
                t.cost += c.signal;
            }
        }
        t.rx_pending = !self.send_pkt.is_empty();
        t
    }
}

/// Per-call costs of the relay process (socat-like: `read` on the vsock
/// socket, `write` on a TCP socket).
#[derive(Clone, Copy, Debug, Default)]
pub struct RelayCosts {
    /// One system call (entry, exit, fd lookup).
    pub syscall: Time,
    /// Copy per KiB out of the vsock socket into the relay's buffer (the
    /// copy into the TCP socket is the host stack's).
    pub copy_per_kib: Time,
    /// socat's `select()` on its two descriptors before each transfer.
    pub select: Time,
}

/// The host-side relay: reads the guest's stream from the accepted vsock
/// socket and writes it to a TCP socket toward the remote peer. vsock is
/// host-local, so a deployment that sends to another host needs one (a
/// named assumption of the vsock scenarios).
#[derive(Clone, Copy, Debug)]
pub struct Relay {
    /// Its read buffer (socat's `-b`, 8192 by default).
    pub buf: u32,
    /// Bytes read in all.
    pub bytes: u64,
    /// Calls made (reads and writes).
    pub calls: u64,
}

impl Relay {
    /// A relay reading `buf` bytes per call.
    pub fn new(buf: u32) -> Self {
        Relay {
            buf: buf.max(1),
            bytes: 0,
            calls: 0,
        }
    }

    /// One read + write: the bytes moved (0 if none are queued), its CPU
    /// time, and whether the read made the host send a CREDIT_UPDATE
    /// (queued on the back end; the caller queues its RX handler).
    pub fn step(&mut self, b: &mut VhostVsock, c: &RelayCosts) -> (u32, Time, bool) {
        self.step_max(b, c, u32::MAX)
    }

    /// [`Self::step`] moving at most `max` bytes (the room in the socket
    /// it writes to: socat reads only once `select()` says both ends are
    /// ready, and then at most its buffer).
    pub fn step_max(&mut self, b: &mut VhostVsock, c: &RelayCosts, max: u32) -> (u32, Time, bool) {
        let Some(conn) = b.conn.as_mut() else {
            return (0, 0, false);
        };
        let (n, update) = conn.recv(self.buf.min(max));
        if n == 0 {
            return (0, 0, false);
        }
        self.bytes += u64::from(n);
        self.calls += 2;
        let cost = c.select + c.syscall * 2 + c.copy_per_kib * u64::from(n) / 1024;
        let sent = update.is_some();
        if let Some(u) = update {
            b.queue_for_guest(u);
        }
        (n, cost, sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::time::NS;
    use crate::hw::virtio_vsock::CID_HOST;

    fn costs() -> VsockCosts {
        VsockCosts {
            tx_per_pkt: 500 * NS,
            rx_per_pkt: 400 * NS,
            copy_per_kib: 100 * NS,
            signal: 300 * NS,
        }
    }

    fn connect(event_idx: bool) -> (VirtioVsockDev, VhostVsock, VsockConn) {
        let mut dev = VirtioVsockDev::new(512, event_idx, 3).unwrap();
        let mut b = VhostVsock::new(0, [1, 2], 5000);
        for _ in 0..64 {
            assert!(dev.post_rx_buffer());
        }
        dev.rx.kick_prepare();
        let (mut g, req) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        assert!(dev.send(req));
        dev.tx.kick_prepare();
        let t = b.handle_tx(&mut dev, &costs());
        assert_eq!(t.pkts, 1);
        assert!(t.rx_pending, "the RESPONSE waits for the RX handler");
        let r = b.handle_rx(&mut dev, &costs());
        assert_eq!(r.pkts, 1);
        let resp = dev.recv().unwrap();
        g.on_packet(&resp);
        assert_eq!(g.state, State::Established);
        (dev, b, g)
    }

    /// A guest speaking as another VM (source CID 4 on CID 3's device)
    /// reaches no host socket: its REQUEST opens nothing and its RW bytes
    /// land nowhere, while the device's own guest is served.
    #[test]
    fn packets_not_from_the_devices_guest_cid_are_dropped() {
        let mut dev = VirtioVsockDev::new(64, true, 3).unwrap();
        let mut b = VhostVsock::new(0, [1, 2], 5000).with_guest_cid(3);
        for _ in 0..16 {
            assert!(dev.post_rx_buffer());
        }
        let (_, forged) = VsockConn::connect((4, 1025), (CID_HOST, 5000));
        assert!(dev.send(forged));
        let mut rw = forged;
        rw.op = crate::hw::virtio_vsock::Op::Rw;
        rw.len = 100;
        assert!(dev.send(rw));
        dev.tx.kick_prepare();
        let t = b.handle_tx(&mut dev, &costs());
        assert_eq!(t.pkts, 2);
        assert_eq!(b.counters.misaddressed, 2);
        assert!(
            b.conn.is_none() && b.send_pkt.is_empty(),
            "no socket, no reply"
        );
        let (_, ok) = VsockConn::connect((3, 1025), (CID_HOST, 5000));
        assert!(dev.send(ok));
        dev.tx.kick_prepare();
        b.handle_tx(&mut dev, &costs());
        assert_eq!(b.counters.misaddressed, 2);
        assert_eq!(b.conn.as_ref().map(|c| c.peer), Some((3, 1025)));
    }

    #[test]
    fn a_request_to_a_listener_is_accepted_and_a_stranger_reset() {
        let (mut dev, mut b, _g) = connect(true);
        assert!(b.conn.is_some());
        let (_, req) = VsockConn::connect((3, 1026), (CID_HOST, 9));
        assert!(dev.send(req));
        dev.tx.kick_prepare();
        b.handle_tx(&mut dev, &costs());
        assert_eq!(b.counters.resets, 1);
        assert_eq!(b.send_pkt.back().unwrap().op, Op::Rst);
    }

    #[test]
    fn tx_stops_at_the_packet_weight_and_requeues() {
        let (mut dev, mut b, mut g) = connect(true);
        // 300 small packets: more than VHOST_VSOCK_PKT_WEIGHT, within credit.
        let mut sent = 0;
        while sent < 300 {
            let h = g.send(64).unwrap();
            if !dev.send(h) {
                break;
            }
            sent += 1;
        }
        dev.tx.kick_prepare();
        let t = b.handle_tx(&mut dev, &costs());
        assert!(t.requeue);
        assert_eq!(t.pkts, VHOST_VSOCK_PKT_WEIGHT.min(sent));
    }

    #[test]
    fn rx_waits_for_buffers_and_splits_a_large_packet() {
        let mut dev = VirtioVsockDev::new(64, true, 3).unwrap();
        let mut b = VhostVsock::new(0, [1, 2], 5000);
        let h = Hdr {
            src_cid: CID_HOST,
            dst_cid: 3,
            src_port: 5000,
            dst_port: 1025,
            len: 10_000,
            ty: crate::hw::virtio_vsock::TYPE_STREAM,
            op: Op::Rw,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        };
        b.queue_for_guest(h);
        dev.post_rx_buffer();
        dev.post_rx_buffer();
        dev.rx.kick_prepare();
        let t = b.handle_rx(&mut dev, &costs());
        assert_eq!(
            (t.pkts, t.rx_pending),
            (0, true),
            "3 buffers needed, 2 posted"
        );
        assert_eq!(b.send_pkt.front().unwrap().len, 1808, "the rest waits");
        assert_eq!(b.counters.rx_no_buffer, 1);
        dev.post_rx_buffer();
        assert!(dev.rx.kick_prepare(), "the handler turned refill kicks on");
        let t = b.handle_rx(&mut dev, &costs());
        assert_eq!((t.pkts, t.rx_pending), (1, false));
        let lens: Vec<u32> = std::iter::from_fn(|| dev.recv().map(|h| h.len)).collect();
        assert_eq!(lens, [4096, 4096, 1808]);
    }

    #[test]
    fn the_relay_reads_and_returns_credit() {
        let (mut dev, mut b, mut g) = connect(true);
        let mut relay = Relay::new(64 * 1024);
        let rc = RelayCosts {
            syscall: 200 * NS,
            copy_per_kib: 50 * NS,
            select: 0,
        };
        // Fill the host's buffer: 4 packets of 64 KiB.
        for _ in 0..4 {
            let h = g.send(64 * 1024).unwrap();
            assert!(dev.send(h));
        }
        assert!(g.send(1).is_none(), "credit spent");
        dev.tx.kick_prepare();
        b.handle_tx(&mut dev, &costs());
        let mut updates = 0;
        loop {
            let (n, cost, u) = relay.step(&mut b, &rc);
            if n == 0 {
                break;
            }
            assert_eq!(cost, 2 * 200 * NS + 64 * 50 * NS);
            updates += u32::from(u);
        }
        assert_eq!(relay.bytes, 256 * 1024);
        assert_eq!(updates, 1, "one update once 3/4 of the buffer is drained");
        b.handle_rx(&mut dev, &costs());
        let u = dev.recv().unwrap();
        g.on_packet(&u);
        assert!(g.send(1).is_some(), "credit returned");
    }
}
