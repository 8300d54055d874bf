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
use std::collections::VecDeque;

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

    /// The peer shut down its sending side and every byte it sent was
    /// read: a read returns 0 (end of stream).
    pub fn at_eof(&self) -> bool {
        (self.peer_shutdown & SHUTDOWN_SEND != 0 || self.state == State::Closed)
            && self.credit.rx_bytes == 0
    }

    /// `close()` of the socket (`virtio_transport_close`): if the peer
    /// already shut down both directions, an RST and the socket is gone
    /// (Closed); otherwise a SHUTDOWN of both directions, and the socket
    /// lingers (Closing) until the peer's RST (or the 8 s
    /// `VSOCK_CLOSE_TIMEOUT`, which a served connection never reaches).
    /// None if it is already closed.
    pub fn close(&mut self) -> Option<Hdr> {
        match self.state {
            State::Closed => None,
            State::Connecting => {
                self.state = State::Closed;
                Some(self.packet(Op::Rst, 0, 0))
            }
            _ if self.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND => {
                self.state = State::Closed;
                Some(self.packet(Op::Rst, 0, 0))
            }
            State::Closing => None,
            State::Established => Some(self.shutdown()),
        }
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
                if self.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND && self.credit.rx_bytes == 0 {
                    // Both directions closed by the peer and nothing left
                    // to read: reply with RST and close
                    // (`virtio_transport_recv_connected`: peer_shutdown ==
                    // SHUTDOWN_MASK and `vsock_stream_has_data` <= 0). With
                    // data unread the socket stays until its owner's close.
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
    pub tx: VsockTxCounters,
    pub rx_bufs: u64,
    pub tx_reclaimed: u64,
    pub kicks_rx: u64,
}

/// What the send side did: the counters the one-connection driver and the
/// socket table share.
#[derive(Clone, Copy, Debug, Default)]
pub struct VsockTxCounters {
    /// Packets added to the TX ring (RW and control).
    pub pkts_sent: u64,
    /// RW payload bytes added.
    pub bytes_sent: u64,
    /// TX notifications (`virtqueue_kick_prepare` said yes).
    pub kicks_tx: u64,
    /// send() found no credit (the sender sleeps until an update).
    pub credit_stalls: u64,
    /// A packet found the TX ring full.
    pub ring_full: u64,
}

/// `virtio_vsock_rx_fill` once fewer than half of the RX buffers are
/// posted, then `virtqueue_kick`: whether the RX queue wants a
/// notification.
fn refill_rx(dev: &mut VirtioVsockDev, posted: &mut u16, max: u16, kicks_rx: &mut u64) -> bool {
    if *posted >= max / 2 {
        return false;
    }
    while dev.post_rx_buffer() {
        *posted += 1;
    }
    let kick = dev.rx.kick_prepare();
    *kicks_rx += u64::from(kick);
    kick
}

/// `virtio_transport_stream_enqueue`'s loop, for both the one-connection
/// driver and the socket table: RW packets of `conn` within the peer's
/// credit (at most 64 KiB each), each copied and added to the TX ring,
/// until `bytes` are queued, the ring is full or held by control packets
/// waiting ahead of them (`ring_held`), or the credit runs out; then the
/// kick decision for what was added.
fn enqueue_stream(
    conn: &mut VsockConn,
    dev: &mut VirtioVsockDev,
    bytes: u32,
    c: &VsockDriverCosts,
    ring_held: bool,
    tx: &mut VsockTxCounters,
) -> SendPass {
    let mut p = SendPass::default();
    while p.bytes < bytes {
        if dev.tx.num_free() == 0 || ring_held {
            tx.ring_full += 1;
            p.blocked = true;
            break;
        }
        let Some(h) = conn.send(bytes - p.bytes) else {
            tx.credit_stalls += 1;
            p.blocked = true;
            break;
        };
        let ok = dev.send(h);
        debug_assert!(ok, "a descriptor was free");
        p.bytes += h.len;
        p.cost += c.tx_pkt + c.copy_per_kib * u64::from(h.len) / 1024;
        tx.pkts_sent += 1;
        tx.bytes_sent += u64::from(h.len);
    }
    p.kick = dev.tx.kick_prepare();
    tx.kicks_tx += u64::from(p.kick);
    p
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
            self.counters.tx.ring_full += 1;
            return false;
        }
        self.counters.tx.pkts_sent += 1;
        let kick = dev.tx.kick_prepare();
        self.counters.tx.kicks_tx += u64::from(kick);
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
        let rx_kick = refill_rx(
            dev,
            &mut self.rx_buf_nr,
            self.rx_buf_max_nr,
            &mut self.counters.kicks_rx,
        );
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
        enqueue_stream(&mut self.conn, dev, bytes, &c, false, &mut self.counters.tx)
    }
}

/// The RST a transport sends for a packet no socket takes
/// (`virtio_transport_reset_no_sock`): addressed back to its sender.
pub fn reset_reply(h: &Hdr) -> Hdr {
    Hdr {
        src_cid: h.dst_cid,
        dst_cid: h.src_cid,
        src_port: h.dst_port,
        dst_port: h.src_port,
        len: 0,
        ty: TYPE_STREAM,
        op: Op::Rst,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    }
}

/// A socket of the guest's table: one connection end and what its
/// program did with it.
#[derive(Clone, Debug)]
pub struct GuestSock {
    /// The connection end.
    pub conn: VsockConn,
    /// The port of the listener it was accepted on.
    pub listener: u32,
    /// The program took it off the accept queue.
    pub accepted: bool,
    /// The program closed it; it stays in the table (bound, so its
    /// packets find it) until the peer's RST (`virtio_transport_close`).
    pub released: bool,
}

/// A listening socket (`vsock_listen`): its port and the connections
/// established on it that the program has not accepted yet.
#[derive(Clone, Debug)]
struct Listener {
    port: u32,
    backlog: usize,
    queue: VecDeque<usize>,
}

/// Counters of the guest's socket table.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct VsockStackCounters {
    pub tx: VsockTxCounters,
    pub rx_bufs: u64,
    pub kicks_rx: u64,
    /// REQUESTs that made a connection on a listener.
    pub requests: u64,
    /// Connections taken off an accept queue.
    pub accepted: u64,
    /// Sockets removed from the table (closed on both sides).
    pub removed: u64,
    /// RSTs sent for packets no socket takes, or for a full backlog.
    pub refused: u64,
    /// RW payload dropped for want of receive buffer (never within
    /// credit).
    pub dropped: u64,
}

/// The guest's virtio-vsock driver with a table of sockets: listeners
/// that accept the host's connections and the connections themselves
/// (`net/vmw_vsock/af_vsock.c`'s bound and connected tables, the
/// transport of `virtio_transport_common.c`). A server's threads share it
/// (one kernel); the device's rings are passed in on every call.
#[derive(Clone, Debug)]
pub struct VsockStack {
    /// Costs.
    pub costs: VsockDriverCosts,
    /// The guest's context id.
    pub cid: u64,
    socks: Vec<Option<GuestSock>>,
    free: Vec<usize>,
    listeners: Vec<Listener>,
    /// Control packets waiting for a TX descriptor (`send_pkt_list`).
    pending: VecDeque<Hdr>,
    rx_buf_nr: u16,
    rx_buf_max_nr: u16,
    /// Counters.
    pub counters: VsockStackCounters,
}

impl VsockStack {
    /// `virtio_vsock_probe` (the RX ring filled) and a listener with
    /// `backlog` on each of `ports`; room for `max_socks` sockets.
    pub fn probe(
        dev: &mut VirtioVsockDev,
        costs: VsockDriverCosts,
        ports: &[u32],
        backlog: usize,
        max_socks: usize,
    ) -> Self {
        let mut n = 0;
        while dev.post_rx_buffer() {
            n += 1;
        }
        let _ = dev.rx.kick_prepare();
        VsockStack {
            costs,
            cid: dev.guest_cid,
            socks: vec![None; max_socks],
            free: (0..max_socks).rev().collect(),
            listeners: ports
                .iter()
                .map(|&port| Listener {
                    port,
                    backlog,
                    queue: VecDeque::with_capacity(backlog.min(max_socks)),
                })
                .collect(),
            pending: VecDeque::with_capacity(max_socks),
            rx_buf_nr: n,
            rx_buf_max_nr: n,
            counters: VsockStackCounters::default(),
        }
    }

    /// Socket `i`, if it exists.
    pub fn sock(&self, i: usize) -> Option<&GuestSock> {
        self.socks.get(i).and_then(|s| s.as_ref())
    }

    /// Sockets in the table (connections open or lingering).
    pub fn open(&self) -> usize {
        self.socks.len() - self.free.len()
    }

    /// Whether the listener on `port` has a connection to accept.
    pub fn accept_pending(&self, port: u32) -> bool {
        self.listeners
            .iter()
            .any(|l| l.port == port && !l.queue.is_empty())
    }

    /// `accept()` on the listener of `port`: the next established
    /// connection (`vsock_accept` → `vsock_dequeue_accept`).
    pub fn accept(&mut self, port: u32) -> Option<usize> {
        let l = self.listeners.iter_mut().find(|l| l.port == port)?;
        let i = l.queue.pop_front()?;
        if let Some(s) = self.socks[i].as_mut() {
            s.accepted = true;
        }
        self.counters.accepted += 1;
        Some(i)
    }

    /// Queues a control packet on TX, or on `send_pkt_list` if the ring is
    /// full (sent at the next completion work). Whether to kick.
    fn queue_control(&mut self, dev: &mut VirtioVsockDev, h: Hdr) -> bool {
        if !self.pending.is_empty() || !dev.send(h) {
            self.counters.tx.ring_full += 1;
            self.pending.push_back(h);
            return false;
        }
        self.counters.tx.pkts_sent += 1;
        let kick = dev.tx.kick_prepare();
        self.counters.tx.kicks_tx += u64::from(kick);
        kick
    }

    fn remove(&mut self, i: usize) {
        if self.socks[i].take().is_some() {
            self.free.push(i);
            self.counters.removed += 1;
        }
    }

    /// The socket `h` is for: connected (both addresses match, not reset).
    fn find(&self, h: &Hdr) -> Option<usize> {
        self.socks.iter().position(|s| {
            s.as_ref().is_some_and(|s| {
                s.conn.state != State::Closed
                    && s.conn.peer == (h.src_cid, h.src_port)
                    && s.conn.local == (h.dst_cid, h.dst_port)
            })
        })
    }

    /// `virtio_transport_recv_pkt` for one packet from the host: a
    /// connected socket's (`virtio_transport_recv_connected`), a
    /// listener's REQUEST (`virtio_transport_recv_listen`: a child socket,
    /// established, on the accept queue, and its RESPONSE; RST if the
    /// backlog is full), or an RST for a packet nobody takes. Returns the
    /// reply's cost and whether it kicks.
    fn deliver(&mut self, dev: &mut VirtioVsockDev, h: &Hdr) -> (Time, bool) {
        let reply = if let Some(i) = self.find(h) {
            let s = self.socks[i].as_mut().expect("found");
            let (reply, ok) = s.conn.on_packet(h);
            if !ok && h.op == Op::Rw {
                self.counters.dropped += u64::from(h.len);
            }
            if s.conn.state == State::Closed && s.released {
                // The program closed it and the peer's RST came: gone.
                self.remove(i);
            }
            reply
        } else if let Some(l) = self
            .listeners
            .iter()
            .position(|l| l.port == h.dst_port && h.dst_cid == self.cid)
        {
            let full = self.listeners[l].queue.len() >= self.listeners[l].backlog;
            match (h.op, self.free.pop()) {
                (Op::Request, Some(i)) if !full => {
                    let (conn, resp) = VsockConn::accept(h).expect("a REQUEST");
                    self.socks[i] = Some(GuestSock {
                        conn,
                        listener: h.dst_port,
                        accepted: false,
                        released: false,
                    });
                    self.listeners[l].queue.push_back(i);
                    self.counters.requests += 1;
                    Some(resp)
                }
                (op, slot) => {
                    if let Some(i) = slot {
                        self.free.push(i);
                    }
                    (op != Op::Rst).then(|| {
                        self.counters.refused += 1;
                        reset_reply(h)
                    })
                }
            }
        } else if h.op != Op::Rst {
            self.counters.refused += 1;
            Some(reset_reply(h))
        } else {
            None
        };
        match reply {
            Some(r) => (self.costs.tx_pkt, self.queue_control(dev, r)),
            None => (0, false),
        }
    }

    /// `virtio_transport_rx_work` then `_tx_work`, as
    /// [`VsockDriver::completion_work`] does for one connection: every used
    /// RX buffer to its socket, the refill below half, the sent buffers
    /// reclaimed, then the control packets that waited for a descriptor.
    /// Returns (CPU time, RX kick, TX kick).
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
                let (t, kick) = self.deliver(dev, &h);
                cost += t;
                tx_kick |= kick;
            }
            if dev.rx.enable_cb() {
                break;
            }
        }
        let rx_kick = refill_rx(
            dev,
            &mut self.rx_buf_nr,
            self.rx_buf_max_nr,
            &mut self.counters.kicks_rx,
        );
        loop {
            dev.tx.disable_cb();
            while dev.tx.get_used().is_some() {}
            if dev.tx.enable_cb() {
                break;
            }
        }
        let mut sent = false;
        while let Some(&h) = self.pending.front() {
            if !dev.send(h) {
                break;
            }
            self.pending.pop_front();
            self.counters.tx.pkts_sent += 1;
            sent = true;
        }
        if sent {
            let kick = dev.tx.kick_prepare();
            self.counters.tx.kicks_tx += u64::from(kick);
            tx_kick |= kick;
        }
        (cost, rx_kick, tx_kick)
    }

    /// `recv()` of up to `bytes` on socket `i`: (bytes read, CPU time of
    /// the copy and of a credit update if the transport sends one, kick).
    pub fn recv(&mut self, dev: &mut VirtioVsockDev, i: usize, bytes: u32) -> (u32, Time, bool) {
        let Some(s) = self.socks.get_mut(i).and_then(|s| s.as_mut()) else {
            return (0, 0, false);
        };
        let (n, update) = s.conn.recv(bytes);
        let mut cost = self.costs.copy_per_kib * u64::from(n) / 1024;
        let mut kick = false;
        if let Some(u) = update {
            cost += self.costs.tx_pkt;
            kick = self.queue_control(dev, u);
        }
        (n, cost, kick)
    }

    /// `send()` of up to `bytes` on socket `i`, as [`VsockDriver::send`]:
    /// RW packets within the peer's credit, each copied onto the TX ring.
    pub fn send(&mut self, dev: &mut VirtioVsockDev, i: usize, bytes: u32) -> SendPass {
        let c = self.costs;
        let Some(s) = self.socks.get_mut(i).and_then(|s| s.as_mut()) else {
            return SendPass {
                blocked: true,
                ..SendPass::default()
            };
        };
        let held = !self.pending.is_empty();
        enqueue_stream(&mut s.conn, dev, bytes, &c, held, &mut self.counters.tx)
    }

    /// `close()` of socket `i` (`vsock_release` → `virtio_transport_close`):
    /// its SHUTDOWN (it lingers until the peer's RST) or, if the peer
    /// already shut down, its RST (it goes at once). (CPU time, kick.)
    pub fn close(&mut self, dev: &mut VirtioVsockDev, i: usize) -> (Time, bool) {
        let Some(s) = self.socks.get_mut(i).and_then(|s| s.as_mut()) else {
            return (0, false);
        };
        s.released = true;
        let pkt = s.conn.close();
        let gone = s.conn.state == State::Closed;
        let mut out = (0, false);
        if let Some(h) = pkt {
            out = (self.costs.tx_pkt, self.queue_control(dev, h));
        }
        if gone {
            self.remove(i);
        }
        out
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

    /// `virtio_transport_recv_connected`: a peer's SHUTDOWN of both
    /// directions resets only once nothing is left to read; with data
    /// unread the socket stays until its owner's close(), which is then an
    /// RST. A close() before the peer shut down sends SHUTDOWN and lingers
    /// (Closing) until the peer's RST.
    #[test]
    fn shutdown_with_unread_data_waits_for_the_close() {
        let (mut g, req) = VsockConn::connect((3, 80), (CID_HOST, 2000));
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        g.on_packet(&resp);
        let d = g.send(4334).unwrap();
        assert_eq!(h.on_packet(&d), (None, true));
        let sd = g.close().unwrap();
        assert_eq!(
            (sd.op, sd.flags),
            (Op::Shutdown, SHUTDOWN_RCV | SHUTDOWN_SEND)
        );
        assert_eq!(g.state, State::Closing, "lingers until the RST");
        assert_eq!(h.on_packet(&sd), (None, true), "data unread: no RST");
        assert_eq!(h.state, State::Established);
        assert!(!h.at_eof());
        assert_eq!(h.recv(8192).0, 4334);
        assert!(h.at_eof());
        let rst = h.close().unwrap();
        assert_eq!(rst.op, Op::Rst);
        assert_eq!(h.state, State::Closed);
        assert_eq!(h.close(), None, "closed once");
        g.on_packet(&rst);
        assert_eq!(g.state, State::Closed);
        // With nothing unread the SHUTDOWN is answered with RST at once.
        let (mut g, req) = VsockConn::connect((3, 81), (CID_HOST, 2001));
        let (mut h, resp) = VsockConn::accept(&req).unwrap();
        g.on_packet(&resp);
        let sd = g.close().unwrap();
        assert_eq!(h.on_packet(&sd).0.map(|r| r.op), Some(Op::Rst));
    }

    /// The guest's listener: a REQUEST makes an established child on the
    /// accept queue and a RESPONSE goes out before accept(); past the
    /// backlog, or on a port nobody listens on, the answer is RST.
    #[test]
    fn a_listener_queues_requests_up_to_its_backlog() {
        let mut dev = VirtioVsockDev::new(16, true, 3).unwrap();
        let costs = VsockDriverCosts::default();
        let mut st = VsockStack::probe(&mut dev, costs, &[80], 1, 4);
        // Two REQUESTs to port 80, one to port 90, through the RX ring.
        let reqs = [(2000, 80), (2001, 80), (2002, 90)]
            .map(|(p, to)| VsockConn::connect((CID_HOST, p), (3, to)).1);
        for r in reqs {
            assert!(dev.fill_rx(r));
        }
        st.completion_work(&mut dev);
        let mut out = Vec::new();
        dev.tx.kick_prepare();
        while let Some(h) = dev.pop_tx() {
            out.push((h.dst_port, h.op));
        }
        assert_eq!(
            out,
            [(2000, Op::Response), (2001, Op::Rst), (2002, Op::Rst)],
            "one accepted, one past the backlog, one to a closed port"
        );
        assert_eq!(st.counters.refused, 2);
        assert!(st.accept_pending(80));
        let i = st.accept(80).unwrap();
        assert_eq!(st.sock(i).unwrap().conn.state, State::Established);
        assert!(!st.accept_pending(80));
        assert_eq!(st.open(), 1);
    }
}
