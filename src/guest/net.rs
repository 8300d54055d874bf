//! The guest's network stack above its devices: TCP sockets, and the
//! virtio-net front-end driver as Linux 3.6's `virtio_net.c` runs it:
//!
//! * transmit (`start_xmit`): reclaim used TX buffers, add the frame to the
//!   TX virtqueue, and kick (a PIO write to the notify port) only when
//!   `virtqueue_kick_prepare` says the device asked for it (ring flags or
//!   EVENT_IDX); TX completion interrupts stay off unless the ring fills;
//! * receive: the RX vector's handler disables RX callbacks and schedules
//!   NAPI; the poll takes used buffers up to the budget, refills the ring
//!   when it is half empty (kicking if asked), and re-enables callbacks
//!   with `virtqueue_enable_cb`, polling again if buffers slipped in.
//!
//! UDP datagrams a task sent and TCP output (data, ACKs, retransmissions)
//! leave through the same
//! transmit path, from process context after a send and from softirq
//! context after a receive or a TCP timer.

use super::app::Metrics;
use super::tcp::{Tcp, TcpConfig, TcpState};
use super::{Action, FrameKind, HrKind, Kernel, KernelOp};
use crate::engine::Time;
use crate::hw::virtio_net::{VirtioNetDev, RX_QUEUE, TX_QUEUE};
use crate::hw::wire::{Frame, Transport, GSO_MAX_SIZE, IP_TCP_HEADERS};
use std::cmp::Reverse;

/// ixgbe's RSS key as Linux 3.5's `ixgbe_setup_mrqc` writes it: ten
/// fixed 32-bit seeds into `RSSRK[0..9]` (random keys came with
/// `netdev_rss_key_fill` in 3.19). Register n's bits 7:0 hold key byte
/// 4n (the 82599's RSSRK layout; later ixgbe copies a byte key into the
/// registers on little-endian hosts), so the bytes are each seed's,
/// least significant first.
pub const IXGBE_RSS_KEY: [u8; crate::hw::x86::nic::RSS_KEY_BYTES] = {
    const SEEDS: [u32; 10] = [
        0xE291_D73D,
        0x1805_EC6C,
        0x2A94_B30D,
        0xA54F_2BEC,
        0xEA49_AF7C,
        0xE214_AD3D,
        0xB855_AABE,
        0x6A3E_67EA,
        0x1436_4D17,
        0x3BED_200D,
    ];
    let mut key = [0u8; crate::hw::x86::nic::RSS_KEY_BYTES];
    let mut i = 0;
    while i < 10 {
        let b = SEEDS[i].to_le_bytes();
        key[4 * i] = b[0];
        key[4 * i + 1] = b[1];
        key[4 * i + 2] = b[2];
        key[4 * i + 3] = b[3];
        i += 1;
    }
    key
};

/// ixgbe's redirection table for `queues` RSS queues (`ixgbe_setup_mrqc`):
/// entry i names queue i mod `queues`.
pub fn ixgbe_reta(queues: u8) -> [u8; crate::hw::x86::nic::RETA_ENTRIES] {
    let q = queues.max(1);
    std::array::from_fn(|i| (i % usize::from(q)) as u8)
}

/// GRO holds packets of at most this many flows per NAPI (Linux
/// `MAX_GRO_SKBS`).
pub const MAX_GRO_SKBS: usize = 8;

/// The guest's view of its virtio-net device (from PCI config space).
#[derive(Clone, Copy, Debug)]
pub struct VirtioNetGuest {
    /// MSI-X vector of the RX queue.
    pub rx_vector: u8,
    /// MSI-X vector of the TX queue.
    pub tx_vector: u8,
    /// The legacy virtio-pci QUEUE_NOTIFY port.
    pub notify_port: u16,
}

/// A connected TCP socket.
pub struct TcpSock {
    /// The connection.
    pub tcp: Tcp,
    /// Its flow id.
    pub flow: u16,
    /// The task that owns it (woken when it has news).
    pub task: Option<usize>,
    /// The deadline of its timer (delayed ACK / RTO), if armed.
    pub(super) timer: Option<Time>,
    /// Bumped whenever `timer` changes: older wheel entries are stale.
    pub(super) timer_gen: u64,
    /// On its task's ready list.
    pub(super) ready: bool,
}

/// Counters of the guest's network stack.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct NetCounters {
    pub virtio_irqs: u64,
    pub virtio_rx_frames: u64,
    pub tx_frames: u64,
    pub kicks_tx: u64,
    pub kicks_rx: u64,
    pub kicks_suppressed: u64,
    pub tx_ring_full: u64,
    pub unknown_flow: u64,
    pub gro_merged: u64,
}

/// Guest-visible device memory the driver works on: the VF's BAR and DMA
/// rings, and the virtio-net device's virtqueues.
pub struct Devices<'a> {
    /// The SR-IOV NIC (its VF).
    pub nic: &'a mut crate::hw::x86::nic::Nic,
    /// The virtio-net device, if the VM has one.
    pub virtio_net: Option<&'a mut VirtioNetDev>,
    /// The virtio-blk device, if the VM has one.
    pub virtio_blk: Option<&'a mut crate::hw::virtio_blk::VirtioBlkDev>,
    /// Guest memory a host service shares with the VM's processes
    /// (vCanal's channel), if any.
    pub shared: Option<&'a mut crate::hw::guest_memory::GuestMemory>,
    /// The virtio-vsock device, if the VM has one.
    pub vsock: Option<&'a mut crate::hw::virtio_vsock::VirtioVsockDev>,
}

impl Kernel {
    /// Opens a connected TCP socket for flow `flow`, owned by task `task`.
    pub fn tcp_open(&mut self, flow: u16, cfg: TcpConfig, task: Option<usize>) -> usize {
        // A configuration error would have been caught when the scenario
        // was built; fall back to Linux defaults rather than abort.
        let tcp = Tcp::new(cfg).unwrap_or_else(|_| Tcp::new(TcpConfig::default()).unwrap());
        self.tcp_socks.push(TcpSock {
            tcp,
            flow,
            task,
            timer: None,
            timer_gen: 0,
            ready: false,
        });
        self.touched_seen.push(false);
        self.tx_dirty_seen.push(false);
        let s = self.tcp_socks.len() - 1;
        // The demultiplexing table (the 5-tuple hash's stand-in).
        let f = usize::from(flow);
        if self.flow_sock.len() <= f {
            self.flow_sock.resize(f + 1, None);
        }
        self.flow_sock[f] = Some(s);
        if let Some(t) = task {
            self.tasks[t].tcp = Some(s);
        }
        s
    }

    /// `virtnet_probe`: fill the RX ring and publish it; TX completion
    /// interrupts stay off (buffers are reclaimed on the next transmit).
    pub fn virtio_net_probe(&mut self, vn: &mut VirtioNetDev) {
        while vn.rx_add_buffer() {}
        // The device is not running yet: the probe's notify is not a kick
        // the model needs to deliver.
        let _ = vn.rx_kick_prepare();
        vn.tx_disable_cb();
    }

    /// Opens connected sockets for flows `flows`, owned by task `task`,
    /// which serves them all (an epoll loop) through `Sys::conns`.
    /// Returns their socket indices.
    pub fn tcp_open_many(
        &mut self,
        flows: impl Iterator<Item = u16>,
        cfg: TcpConfig,
        task: usize,
    ) -> std::ops::Range<usize> {
        let first = self.tcp_socks.len();
        for f in flows {
            let s = self.tcp_open(f, cfg, None);
            self.tcp_socks[s].task = Some(task);
        }
        self.tasks[task].multi_tcp = true;
        first..self.tcp_socks.len()
    }

    /// Makes socket `s` a passive endpoint (`listen`): a client's SYN
    /// opens its connection, which the program then accepts. The flow
    /// stands for the listener's connections from one client slot.
    pub fn tcp_listen(&mut self, s: usize) {
        let cfg = *self.tcp_socks[s].tcp.config();
        if let Ok(t) = Tcp::listen(cfg) {
            self.tcp_socks[s].tcp = t;
        }
    }

    /// TCP metrics of every socket.
    pub(super) fn net_metrics(&self, out: &mut Metrics) {
        let n = &self.net;
        out.insert("guest.virtio_irqs".into(), n.virtio_irqs as f64);
        out.insert("guest.virtio_rx_frames".into(), n.virtio_rx_frames as f64);
        out.insert("guest.tx_frames".into(), n.tx_frames as f64);
        // netif_stop_queue: the device's TX ring was full.
        out.insert("guest.tx_ring_full".into(), n.tx_ring_full as f64);
        out.insert("guest.virtio_kicks_tx".into(), n.kicks_tx as f64);
        out.insert("guest.virtio_kicks_rx".into(), n.kicks_rx as f64);
        out.insert(
            "guest.virtio_kicks_suppressed".into(),
            n.kicks_suppressed as f64,
        );
        if self.cfg.gro {
            out.insert("guest.gro_merged".into(), n.gro_merged as f64);
        }
        let rexmit: u64 = self
            .tcp_socks
            .iter()
            .map(|s| s.tcp.counters().retransmits)
            .sum();
        if !self.tcp_socks.is_empty() {
            out.insert("guest.tcp_retransmits".into(), rexmit as f64);
        }
    }

    /// `napi_gro_receive` as Linux 3.6 runs it for TCP over IPv4
    /// (`dev_gro_receive` → `tcp_gro_receive`): a frame that continues a
    /// held packet of its flow (next sequence number, same ACK, no longer
    /// than the held packet's segment size, the whole below 64 KiB) is
    /// merged into it; one shorter than that size or with PSH then sends
    /// the packet up at once. A frame that cannot join sends the held one
    /// up first. A new data segment without PSH is held (at most
    /// `MAX_GRO_SKBS` flows); anything else (ACKs, UDP, ICMP) goes up as
    /// it came, and so does a packet that is already GSO (virtio-net).
    /// Held packets go up at `napi_complete` ([`Self::gro_flush`]).
    /// Returns the receive cost charged now.
    pub(super) fn gro_receive(&mut self, f: Frame, now: Time) -> Time {
        let c = self.cfg.costs;
        let Transport::Tcp(seg) = f.transport else {
            return self.rx_deliver(f, now);
        };
        if !self.cfg.gro {
            return self.rx_deliver(f, now);
        }
        let mut cost = 0;
        let held = self.cpus[self.on].gro.iter().position(|h| h.flow == f.flow);
        if f.gso_size > 0 {
            // A packet that is already GSO (virtio-net's GUEST_TSO4) skips
            // GRO (`skb_is_gso` → GRO_NORMAL); a held packet of its flow
            // goes up first so TCP sees the bytes in order.
            if let Some(i) = held {
                let p = self.cpus[self.on].gro.remove(i);
                cost += self.gro_up(p, now);
            }
            return cost + self.rx_deliver(f, now);
        }
        if let Some(i) = held {
            let held = &mut self.cpus[self.on].gro[i];
            let Transport::Tcp(h) = &mut held.transport else {
                unreachable!("only TCP packets are held")
            };
            let size = if held.gso_size > 0 {
                u32::from(held.gso_size)
            } else {
                h.len
            };
            // skb_gro_receive: the IP datagram stays below 64 KiB.
            let fits = h.len + seg.len + IP_TCP_HEADERS < GSO_MAX_SIZE;
            // tcp_gro_receive flushes on SYN or FIN.
            if seg.len > 0
                && !seg.syn
                && !seg.fin
                && seg.len <= size
                && h.seq + u64::from(h.len) == seg.seq
                && h.ack == seg.ack
                && fits
            {
                h.len += seg.len;
                h.psh |= seg.psh;
                held.gso_size = u16::try_from(size).unwrap_or(u16::MAX);
                self.net.gro_merged += 1;
                if seg.len < size || seg.psh {
                    let p = self.cpus[self.on].gro.remove(i);
                    cost += self.gro_up(p, now);
                }
                return cost + c.gro_merge;
            }
            let p = self.cpus[self.on].gro.remove(i);
            cost += self.gro_up(p, now);
        }
        if seg.len > 0
            && !seg.psh
            && !seg.fin
            && !seg.syn
            && self.cpus[self.on].gro.len() < MAX_GRO_SKBS
        {
            // The packet's receive above the driver is paid when it goes
            // up (here, or on its RPS CPU).
            self.cpus[self.on].gro.push(f);
            return cost + self.rx_driver_cost();
        }
        cost + self.rx_deliver(f, now)
    }

    /// `napi_gro_flush`: every held packet goes up, oldest first. Returns
    /// their cost.
    pub(super) fn gro_flush(&mut self, now: Time) -> Time {
        let mut cost = 0;
        for k in 0..self.cpus[self.on].gro.len() {
            let p = self.cpus[self.on].gro[k];
            cost += self.gro_up(p, now);
        }
        self.cpus[self.on].gro.clear();
        cost
    }

    /// A frame came up from a device (NAPI): hand it to its socket.
    /// Returns the transport processing cost.
    pub(super) fn netif_receive(&mut self, f: Frame, now: Time) -> Time {
        match f.transport {
            Transport::Udp { .. } => {
                if let Some(d) = super::app::Datagram::of(&f) {
                    self.udp_deliver(d);
                }
                0
            }
            Transport::Icmp { .. } => self.icmp_rcv(f),
            Transport::Tcp(seg) => {
                let Some(s) = self.flow_sock.get(usize::from(f.flow)).copied().flatten() else {
                    self.net.unknown_flow += 1;
                    return 0;
                };
                let before = self.tcp_socks[s].tcp.state();
                self.tcp_socks[s].tcp.on_segment(seg, now);
                self.tcp_timer_sync(s, now);
                self.tx_mark(s);
                let tcp = &self.tcp_socks[s].tcp;
                let mut cost = self.cfg.costs.tcp_rx_segment;
                let after = tcp.state();
                if after == TcpState::SynReceived && before != after {
                    cost += self.cfg.costs.tcp_conn_request;
                } else if before == TcpState::SynReceived && after != before {
                    cost += self.cfg.costs.tcp_syn_recv_sock;
                }
                // A closed socket has no reader, and a half-open one is
                // not yet in the accept queue: neither wakes the program.
                let quiet = tcp.is_closed_by_app() || after == TcpState::SynReceived;
                if quiet {
                    return cost;
                }
                if let Some(t) = self.tcp_socks[s].task {
                    if self.tasks[t].multi_tcp && !self.tcp_socks[s].ready {
                        self.tcp_socks[s].ready = true;
                        self.tasks[t].ready.push(s);
                    }
                    self.wake(t);
                }
                cost
            }
        }
    }

    /// Binds task `task`'s UDP socket to `flow`: datagrams of that flow go
    /// to it (the others still to the first socket).
    pub fn udp_bind(&mut self, flow: u16, task: usize) {
        if let Some(s) = self.tasks[task].socket {
            self.udp_binds.retain(|b| b.0 != flow);
            self.udp_binds.push((flow, s));
        }
    }

    /// `udp_rcv`: a datagram to the socket bound to its flow, or to the
    /// first socket (the VF's UDP port) when none is.
    fn udp_deliver(&mut self, d: super::app::Datagram) {
        let Some(&(_, s)) = self.udp_binds.iter().find(|b| b.0 == d.flow) else {
            self.socket_enqueue(d);
            return;
        };
        if self.sockets[s].len() >= self.cfg.rcvbuf_packets {
            self.counters.socket_drops += 1;
            return;
        }
        self.sockets[s].push_back(d);
        if let Some(t) = self.tasks.iter().position(|t| t.socket == Some(s)) {
            self.wake(t);
        }
    }

    /// A task blocked: if its sendto() found the UDP send buffer full, it
    /// sleeps until the buffer drains (`sock_wait_for_wmem`).
    pub(super) fn udp_wait_for_space(&mut self, t: usize) {
        if self.tasks[t].socket.is_some()
            && self.udp_tx.len() >= super::app::UDP_SNDBUF_DATAGRAMS
            && !self.udp_tx_waiters.contains(&t)
        {
            self.udp_tx_waiters.push(t);
        }
    }

    /// The transmit path took a datagram: once the send buffer is half
    /// empty, the writers blocked on it wake (`sock_wfree` →
    /// `sk_write_space`).
    fn udp_write_space(&mut self) {
        if self.udp_tx_waiters.is_empty()
            || self.udp_tx.len() > super::app::UDP_SNDBUF_DATAGRAMS / 2
        {
            return;
        }
        for i in 0..self.udp_tx_waiters.len() {
            let t = self.udp_tx_waiters[i];
            self.wake(t);
        }
        self.udp_tx_waiters.clear();
    }

    /// `icmp_rcv` in the receive softirq: an echo request is answered at
    /// once (`icmp_echo` → `icmp_reply` → `ip_push_pending_frames`),
    /// without waking any task; the reply joins the transmit queue, ahead
    /// of nothing but frames already waiting for ring space. It carries the
    /// request's timestamp (ping's payload) back. Returns the cost.
    fn icmp_rcv(&mut self, f: Frame) -> Time {
        let Transport::Icmp {
            request: true,
            len,
            seq,
        } = f.transport
        else {
            return 0;
        };
        // The device queue's limit (txqueuelen-like): beyond it the reply
        // is dropped.
        if self.tx_backlog.len() >= super::app::UDP_SNDBUF_DATAGRAMS {
            return self.cfg.costs.icmp_echo;
        }
        self.tx_backlog
            .push_back(Frame::icmp(f.flow, false, len, seq, f.sent));
        self.tx_pending = true;
        self.cfg.costs.icmp_echo
    }

    /// Keeps socket `s`'s wheel timer at its TCP endpoint's next deadline.
    pub(super) fn tcp_timer_sync(&mut self, s: usize, _now: Time) {
        let next = self.tcp_socks[s].tcp.next_timer();
        let p = self.tick_period();
        let sock = &mut self.tcp_socks[s];
        if next == sock.timer {
            return;
        }
        sock.timer = next;
        sock.timer_gen += 1;
        if let Some(t) = next {
            // TCP's timers live on the jiffy timer wheel (sk_reset_timer →
            // mod_timer), not on hrtimers: they expire with the tick after
            // their deadline and never reprogram the clockevent themselves.
            let gen = sock.timer_gen;
            if self.tcp_wheel.len() >= 2 * self.tcp_socks.len() + 16 {
                // Each re-arm leaves the old entry stale: once they
                // outnumber the sockets, drop them in place (they would
                // only have been skipped), so the wheel stays about as
                // deep as the number of sockets.
                let socks = &self.tcp_socks;
                self.tcp_wheel.retain(|&Reverse((_, s, gen))| {
                    socks[s].timer.is_some() && socks[s].timer_gen == gen
                });
            }
            self.tcp_wheel.push(Reverse((t.div_ceil(p) * p, s, gen)));
        }
        self.tcp_wheel_sync();
    }

    /// Drops stale entries from the top of the wheel and keeps one hrtimer
    /// at the earliest live one (the tick that will run the wheel).
    fn tcp_wheel_sync(&mut self) {
        while let Some(&Reverse((_, s, gen))) = self.tcp_wheel.peek() {
            if self.tcp_wheel_live(s, gen) {
                break;
            }
            self.tcp_wheel.pop();
        }
        let next = self.tcp_wheel.peek().map(|r| r.0 .0);
        if next != self.tcp_wheel_armed {
            // The wheel's hrtimer may sit on another CPU's list (the one
            // that armed it last): one wheel, one timer. Only that list
            // can hold it, so only it is searched.
            if let Some(c) = self.tcp_wheel_cpu.take() {
                self.cpus[c].hrtimers.retain(|h| h.1 != HrKind::TcpWheel);
            }
            if let Some(t) = next {
                self.cpus[self.on].hrtimers.push((t, HrKind::TcpWheel));
                self.tcp_wheel_cpu = Some(self.on);
            }
            self.tcp_wheel_armed = next;
        }
    }

    /// Whether a wheel entry of socket `s` with generation `gen` is its
    /// current timer (not one since moved or fired).
    fn tcp_wheel_live(&self, s: usize, gen: u64) -> bool {
        let sock = &self.tcp_socks[s];
        sock.timer.is_some() && sock.timer_gen == gen
    }

    /// The tick ran the timer wheel: every TCP timer due by `now` fires,
    /// earliest first (socket order within one tick).
    pub(super) fn tcp_wheel_run(&mut self, now: Time) {
        self.tcp_wheel_armed = None;
        while let Some(&Reverse((t, s, gen))) = self.tcp_wheel.peek() {
            if t > now {
                break;
            }
            self.tcp_wheel.pop();
            if self.tcp_wheel_live(s, gen) {
                self.tcp_timer_fired(s, now);
            }
        }
        self.tcp_wheel_sync();
    }

    /// A TCP timer expired.
    fn tcp_timer_fired(&mut self, s: usize, now: Time) {
        let sock = &mut self.tcp_socks[s];
        sock.timer = None;
        sock.timer_gen += 1;
        sock.tcp.on_timer(now);
        self.tcp_timer_sync(s, now);
        self.tx_mark(s);
    }

    /// Socket `s` may have output: the transmit path will poll it.
    pub(super) fn tx_mark(&mut self, s: usize) {
        self.tx_pending = true;
        if !self.tx_dirty_seen[s] {
            self.tx_dirty_seen[s] = true;
            self.tx_dirty.push(s);
        }
    }

    /// `tick_nohz_irq_exit`: leaving network processing on a CPU that
    /// stays idle re-evaluates the next timer event (TCP's wheel timers
    /// included); a CPU about to run a woken task restarts its tick on the
    /// switch instead.
    fn irq_exit_nohz(&mut self, now: Time) -> Option<Action> {
        if self.cpus[self.on].current.is_some() || self.cpus[self.on].need_resched {
            return None;
        }
        self.reprogram(now).map(Action::Op)
    }

    /// The next frame any socket with possible output wants to send,
    /// taking the marked sockets in turn.
    fn pull_output(&mut self, now: Time) -> Option<Frame> {
        if let Some(d) = self.udp_tx.pop_front() {
            self.udp_write_space();
            return Some(d.frame());
        }
        while !self.tx_dirty.is_empty() {
            let i = self.tx_rr % self.tx_dirty.len();
            let s = self.tx_dirty[i];
            if let Some(seg) = self.tcp_socks[s].tcp.poll_output(now) {
                self.tx_rr = i + 1;
                self.tcp_timer_sync(s, now);
                let sock = &self.tcp_socks[s];
                return Some(Frame::tcp_gso(sock.flow, seg, sock.tcp.config().mss, now));
            }
            // Nothing more from it until it is marked again.
            self.tx_dirty.swap_remove(i);
            self.tx_dirty_seen[s] = false;
        }
        None
    }

    /// The VF TX queue this CPU sends on: Linux 3.5's
    /// `ixgbe_select_queue` with Flow Director's hashing on (ixgbe's
    /// default) takes the sending CPU's number, wrapped to the queue count
    /// (a locally generated skb has no recorded RX queue).
    fn tx_queue(&self) -> u8 {
        (self.on % usize::from(self.cfg.vf_queues.max(1))) as u8
    }

    /// One step of the transmit frame: `dev_queue_xmit` → the driver's
    /// `start_xmit` for the next pending frame (virtio-net: add to the TX
    /// virtqueue; ixgbevf: write a TX descriptor), then its notification
    /// (virtio: a kick if the device asked; VF: the TDT doorbell, an MMIO
    /// write to the mapped BAR).
    pub(super) fn net_tx_step(
        &mut self,
        top: usize,
        stage: u8,
        now: Time,
        dev: &mut Devices,
    ) -> Option<Action> {
        let virtio = self.cfg.virtio_net;
        let vf = self.cfg.vf;
        if virtio.is_none() && vf.is_none() {
            // No device to send on: the output is dropped.
            while self.pull_output(now).is_some() {}
            self.tx_pending = false;
            self.pop_net_tx();
            return None;
        }
        match stage {
            0 => {
                let next = self
                    .tx_backlog
                    .pop_front()
                    .or_else(|| self.pull_output(now));
                let Some(frame) = next else {
                    self.tx_pending = false;
                    self.pop_net_tx();
                    return self.irq_exit_nohz(now);
                };
                let (added, xmit) = match (dev.virtio_net.as_deref_mut(), vf) {
                    (Some(vn), _) if virtio.is_some() => {
                        // free_old_xmit_skbs, then add the frame.
                        vn.tx_reclaim();
                        (vn.tx_add(frame), self.cfg.costs.virtio_xmit)
                    }
                    (_, Some(vf)) => (
                        dev.nic
                            .tx_enqueue_on(vf, self.tx_queue(), frame)
                            .unwrap_or(false),
                        self.cfg.costs.vf_xmit,
                    ),
                    _ => (false, 0),
                };
                if !added {
                    // Ring full: netif_stop_queue until completions free it.
                    self.net.tx_ring_full += 1;
                    self.tx_backlog.push_front(frame);
                    self.tx_stopped = true;
                    self.tx_pending = false;
                    if let (Some(_), Some(vn)) = (virtio, dev.virtio_net.as_deref_mut()) {
                        // Ask for a TX interrupt once most of it is used.
                        if !vn.tx_enable_cb_delayed() {
                            vn.tx_disable_cb();
                            self.tx_stopped = false;
                            self.tx_pending = true;
                            return None;
                        }
                    }
                    self.pop_net_tx();
                    return self.irq_exit_nohz(now);
                }
                self.net.tx_frames += 1;
                let proto = match frame.transport {
                    Transport::Tcp(_) => self.cfg.costs.tcp_tx_segment,
                    Transport::Udp { .. } => self.cfg.costs.udp_tx_datagram,
                    // The echo reply's IP output is in `icmp_echo`.
                    Transport::Icmp { .. } => 0,
                };
                let cost = proto + xmit;
                self.set_stage(top, 1, cost);
                None
            }
            _ => {
                self.set_stage(top, 0, 0);
                match (virtio, dev.virtio_net.as_deref_mut(), vf) {
                    (Some(cfg), Some(vn), _) => {
                        if vn.tx_kick_prepare() {
                            self.net.kicks_tx += 1;
                            return Some(Action::Op(KernelOp::QueueNotify {
                                port: cfg.notify_port + TX_QUEUE,
                                value: TX_QUEUE as u32,
                            }));
                        }
                        self.net.kicks_suppressed += 1;
                        None
                    }
                    (_, _, Some(vf)) => Some(Action::Op(KernelOp::VfWrite {
                        vf,
                        reg: super::VfReg::Tdt(self.tx_queue()),
                    })),
                    _ => None,
                }
            }
        }
    }

    /// `vring_interrupt` for the virtio-net vectors: RX disables callbacks
    /// and schedules NAPI; TX (only enabled while the queue is stopped)
    /// wakes the queue.
    pub(super) fn virtio_irq(&mut self, vector: u8, dev: &mut Devices) {
        let (Some(cfg), Some(vn)) = (self.cfg.virtio_net, dev.virtio_net.as_deref_mut()) else {
            return;
        };
        self.net.virtio_irqs += 1;
        if vector == cfg.rx_vector {
            vn.rx_disable_cb();
            self.cpus[self.on].napi_virtio = true;
        } else if vector == cfg.tx_vector {
            vn.tx_disable_cb();
            if self.tx_stopped {
                self.tx_stopped = false;
                self.tx_pending = true;
            }
            let _ = vn;
        }
    }

    /// Whether `vector` is one of the virtio-net device's.
    pub(super) fn is_virtio_vector(&self, vector: u8) -> bool {
        self.cfg
            .virtio_net
            .is_some_and(|c| vector == c.rx_vector || vector == c.tx_vector)
    }

    /// One step of `virtnet_poll`.
    pub(super) fn virtio_poll_step(
        &mut self,
        top: usize,
        stage: u8,
        round: u32,
        now: Time,
        dev: &mut Devices,
    ) -> Option<Action> {
        let (Some(cfg), Some(vn)) = (self.cfg.virtio_net, dev.virtio_net.as_deref_mut()) else {
            self.cpus[self.on].napi_virtio = false;
            self.cpus[self.on].in_softirq = false;
            self.pop();
            return None;
        };
        let c = self.cfg.costs;
        match stage {
            // receive_buf for each used buffer, up to the budget.
            0 => {
                if round < self.cfg.napi_weight {
                    if let Some(f) = vn.rx_get() {
                        self.net.virtio_rx_frames += 1;
                        self.counters.rx_packets += 1;
                        let cost = self.gro_receive(f, now);
                        self.cpus[self.on].frames[top].kind =
                            FrameKind::VirtioPoll { round: round + 1 };
                        self.set_compute(top, cost);
                        return None;
                    }
                }
                // Refill when half the ring is used (try_fill_recv).
                self.set_stage(top, 1, 0);
                if vn.rx_outstanding() < vn.queue_size() / 2 {
                    let mut added = 0;
                    while vn.rx_add_buffer() {
                        added += 1;
                    }
                    if added > 0 {
                        self.set_compute(top, c.napi_poll_base);
                        if vn.rx_kick_prepare() {
                            self.net.kicks_rx += 1;
                            return Some(Action::Op(KernelOp::QueueNotify {
                                port: cfg.notify_port + RX_QUEUE,
                                value: RX_QUEUE as u32,
                            }));
                        }
                        self.net.kicks_suppressed += 1;
                    }
                }
                None
            }
            // Budget used: stay scheduled. Otherwise napi_complete and
            // re-enable callbacks; poll again if buffers slipped in.
            1 => {
                if round >= self.cfg.napi_weight {
                    if self.softirq_budget_spent() {
                        return None;
                    }
                    self.cpus[self.on].frames[top].kind = FrameKind::VirtioPoll { round: 0 };
                    self.set_stage(top, 0, c.napi_poll_base);
                    return None;
                }
                // napi_complete flushes GRO's held packets.
                let flushed = self.gro_flush(now);
                if !vn.rx_enable_cb() {
                    vn.rx_disable_cb();
                    self.cpus[self.on].frames[top].kind = FrameKind::VirtioPoll { round: 0 };
                    self.set_stage(top, 0, flushed);
                    return None;
                }
                self.cpus[self.on].napi_virtio = false;
                self.set_stage(top, 2, flushed);
                None
            }
            _ => {
                self.rps_action();
                self.cpus[self.on].in_softirq = false;
                self.pop();
                self.raise_softirq();
                self.irq_exit_nohz(now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::wire::TcpSegment;

    const RX: Time = 1_000;
    const MERGE: Time = 100;
    const TCP: Time = 10_000;

    fn kernel(gro: bool) -> Kernel {
        let mut cfg = crate::guest::test_config();
        cfg.gro = gro;
        cfg.costs.rx_per_packet = RX;
        cfg.costs.gro_merge = MERGE;
        cfg.costs.tcp_rx_segment = TCP;
        let mut k = Kernel::new(cfg);
        k.tcp_open(1, TcpConfig::default(), None);
        k
    }

    fn data(seq: u64, len: u32, psh: bool) -> Frame {
        let seg = TcpSegment {
            seq,
            len,
            ack: 0,
            wnd: 65_535,
            psh,
            ..Default::default()
        };
        Frame::tcp(1, seg, 0)
    }

    fn received(k: &Kernel) -> u64 {
        k.tcp_socks[0].tcp.bytes_received()
    }

    /// Consecutive MSS frames merge; the packet goes up once, at the
    /// flush, with all their bytes.
    #[test]
    fn consecutive_frames_go_up_as_one_packet_at_the_flush() {
        let mut k = kernel(true);
        let costs: Vec<Time> = (0..3)
            .map(|i| k.gro_receive(data(i * 1448, 1448, false), 0))
            .collect();
        assert_eq!(costs, [RX, MERGE, MERGE]);
        assert_eq!(received(&k), 0, "held until napi_complete");
        assert_eq!(k.gro_flush(0), TCP);
        assert_eq!(received(&k), 3 * 1448);
        assert_eq!(k.net.gro_merged, 2);
        assert_eq!(k.gro_flush(0), 0, "nothing left");
    }

    /// PSH or a short frame ends the packet at once; a gap, or an ACK,
    /// sends the held packet up first.
    #[test]
    fn psh_short_gap_and_acks_end_a_packet() {
        let mut k = kernel(true);
        k.gro_receive(data(0, 1448, false), 0);
        assert_eq!(k.gro_receive(data(1448, 1448, true), 0), MERGE + TCP);
        assert_eq!(received(&k), 2 * 1448);
        k.gro_receive(data(2 * 1448, 1448, false), 0);
        assert_eq!(k.gro_receive(data(3 * 1448, 100, false), 0), MERGE + TCP);
        assert_eq!(received(&k), 3 * 1448 + 100);
        // A gap: the held packet goes up, the new frame is held.
        let next = 3 * 1448 + 100;
        k.gro_receive(data(next, 1448, false), 0);
        assert_eq!(k.gro_receive(data(next + 5_000, 1448, false), 0), TCP + RX);
        assert_eq!(received(&k), next + 1448);
        // A pure ACK flushes what is held and goes up by itself.
        let ack = Frame::tcp(1, TcpSegment::default(), 0);
        assert_eq!(k.gro_receive(ack, 0), TCP + RX + TCP);
        assert!(k.cpus[k.on].gro.is_empty());
    }

    /// A packet stays below 64 KiB: the 46th MSS frame starts a new one.
    #[test]
    fn packets_stay_below_gso_max_size() {
        let mut k = kernel(true);
        for i in 0..45 {
            k.gro_receive(data(i * 1448, 1448, false), 0);
        }
        assert_eq!(k.gro_receive(data(45 * 1448, 1448, false), 0), TCP + RX);
        assert_eq!(received(&k), 45 * 1448);
        let Transport::Tcp(held) = k.cpus[k.on].gro[0].transport else {
            panic!("not TCP")
        };
        assert_eq!((held.seq, held.len), (45 * 1448, 1448));
    }

    /// A packet that arrives already GSO (virtio-net) goes up at once,
    /// after a held packet of its flow.
    #[test]
    fn gso_packets_skip_gro() {
        let mut k = kernel(true);
        k.gro_receive(data(0, 1448, false), 0);
        let seg = TcpSegment {
            seq: 1448,
            len: 10 * 1448,
            ack: 0,
            wnd: 65_535,
            psh: false,
            syn: false,
            fin: false,
        };
        let p = Frame::tcp_gso(1, seg, 1448, 0);
        assert_eq!(k.gro_receive(p, 0), TCP + RX + TCP);
        assert_eq!(received(&k), 11 * 1448);
        assert!(k.cpus[k.on].gro.is_empty());
    }

    /// Without GRO every frame pays the whole receive path.
    #[test]
    fn without_gro_each_frame_goes_up_alone() {
        let mut k = kernel(false);
        for i in 0..3 {
            assert_eq!(k.gro_receive(data(i * 1448, 1448, false), 0), RX + TCP);
        }
        assert_eq!(received(&k), 3 * 1448);
        assert_eq!(k.gro_flush(0), 0);
    }
}
