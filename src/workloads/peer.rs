//! A peer host process: the other end of a guest's TCP connections or UDP
//! flows, either a process on the VM's host reached through the bridge and
//! vhost (DID's PV configurations) or the NIC's embedded switch (SR-IOV), or
//! the load generator behind the 10 GbE link. Its kernel stack and the
//! process share its CPUs, served in arrival order: each received segment
//! or datagram, each sent one and each wake-up of the process costs
//! calibrated time, and a frame leaves only when the CPU reaches it.

use crate::engine::Time;
use crate::guest::app::{Conns, Datagram, Metrics};
use crate::guest::tcp::Tcp;
use crate::hw::wire::{Frame, Transport};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Costs of the peer's stack (from the calibration file).
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerCosts {
    /// Receive path per segment (driver/bridge, IP, TCP).
    pub rx_segment: Time,
    /// Transmit path per segment (TCP, IP, device).
    pub tx_segment: Time,
    /// Waking the blocked process and switching to it.
    pub wakeup: Time,
    /// Receive path per UDP datagram (driver/bridge, IP, UDP, socket queue).
    pub udp_rx: Time,
    /// Transmit path per UDP datagram (sendto, IP, device).
    pub udp_tx: Time,
    /// GRO's work for a received frame merged into a held packet, in place
    /// of `rx_segment` (the packet pays `rx_segment` once).
    pub gro_merge: Time,
    /// The receiving NIC's interrupt moderation: interrupts at least this
    /// far apart, each followed by a NAPI poll that takes every frame that
    /// arrived and GRO-merges them (0: an interrupt and a receive per
    /// frame, as a host process behind the bridge takes them).
    pub rx_itr: Time,
    /// The driver adapts the interval after each poll (the ixgbe-family
    /// update, [`crate::guest::itr`]), its register counting units of the
    /// given length; `None`: `rx_itr` stays.
    pub rx_adaptive: Option<(crate::guest::itr::ItrParams, Time)>,
    /// The receiving host's GRO is off (`net.peer_gro = false`,
    /// `ethtool -K gro off`): each frame of a poll goes up the stack
    /// alone, paying `rx_segment`, and TCP acknowledges them as they come
    /// (a delayed ACK per two full-sized segments) instead of once per
    /// merged packet.
    pub gro_off: bool,
}

/// What a peer program reaches through its sockets.
pub struct PeerIo<'a> {
    /// Its TCP connections.
    pub conns: Conns<'a, Tcp>,
    /// Datagrams received on its UDP socket, oldest first.
    pub udp_rx: &'a mut VecDeque<Datagram>,
    /// Datagrams it sends (`flow` says to whom); the stack takes them
    /// after the call.
    pub udp_tx: &'a mut Vec<Datagram>,
}

/// What a peer application does when its connections change.
pub trait PeerApp {
    /// Called at start, when data, acknowledgements or datagrams arrive,
    /// and at the time it last asked for. Reads and writes through `io`;
    /// returns the CPU time it used and when it wants to be called again,
    /// if ever.
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>);
    /// The warm-up is over.
    fn reset_metrics(&mut self);
    /// Adds its metrics.
    fn metrics(&self, out: &mut Metrics);
    /// The latency distributions behind its percentile metrics.
    fn latencies<'a>(&'a self, _out: &mut Vec<crate::guest::app::LatencyFamily<'a>>) {}
}

/// One peer process with its connections (flows `first_flow..`), running
/// on `cpus` CPUs: connection i's segments are handled by CPU i mod cpus.
pub struct PeerHost {
    /// The connections.
    pub conns: Vec<Tcp>,
    first_flow: u16,
    /// Flows it owns: its connections, or more for UDP.
    flows: u16,
    udp_rx: VecDeque<Datagram>,
    udp_tx: Vec<Datagram>,
    app: Box<dyn PeerApp>,
    costs: PeerCosts,
    busy_until: Vec<Time>,
    app_timer: Option<Time>,
    /// Each connection's next timer, as of when it was last touched.
    timers: Vec<Option<Time>>,
    /// The same deadlines, earliest first; an entry whose connection's
    /// deadline has moved is stale and skipped.
    timer_heap: BinaryHeap<Reverse<(Time, usize)>>,
    due: Vec<usize>,
    /// Connections that received, timed out or were written since their
    /// output was last sent (the kernel's work list).
    touched: Vec<usize>,
    seen: Vec<bool>,
    /// Connections that received or timed out since the process last ran
    /// (what its next epoll_wait returns).
    pending: Vec<usize>,
    pending_seen: Vec<bool>,
    /// The connections that received or timed out before the app's poll.
    ready: Vec<usize>,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames received.
    pub frames_in: u64,
    /// Its datagram socket is a raw ICMP socket (ping): what the program
    /// sends leaves as echo requests.
    icmp: bool,
    /// Datagrams dropped at a full socket receive queue.
    pub udp_drops: u64,
    /// Frames in the NIC's RX ring, waiting for the moderated interrupt.
    rx_ring: VecDeque<Frame>,
    /// When the moderated interrupt fires (frames are waiting).
    rx_irq_at: Option<Time>,
    /// When the last one fired.
    rx_last_irq: Option<Time>,
    /// Packets GRO holds during a poll: (connection, merged frame, frames
    /// merged into it, closed to more).
    gro_held: Vec<(usize, Frame, u32, bool)>,
    /// Receive interrupts taken (moderated mode).
    pub rx_interrupts: u64,
    /// The adaptive driver's state.
    rx_itr_state: Option<crate::guest::itr::DynamicItr>,
}

/// Datagrams a peer's socket receive queue holds (Linux's `rmem_default`
/// 208 KiB over ~200-byte truesize-charged datagrams is about a thousand);
/// more are dropped, as `udp_queue_rcv_skb` does on a full buffer.
pub const PEER_UDP_RCVBUF_DATAGRAMS: usize = 1024;

impl PeerHost {
    /// A peer running `app` on connections `conns` (flows from
    /// `first_flow`) with `cpus` CPUs.
    pub fn new(
        conns: Vec<Tcp>,
        first_flow: u16,
        app: Box<dyn PeerApp>,
        costs: PeerCosts,
        cpus: usize,
    ) -> Self {
        let n = conns.len();
        PeerHost {
            flows: n as u16,
            udp_rx: VecDeque::with_capacity(256),
            udp_tx: Vec::with_capacity(256),
            conns,
            first_flow,
            app,
            costs,
            busy_until: vec![0; cpus.max(1)],
            app_timer: Some(0),
            timers: vec![None; n],
            timer_heap: BinaryHeap::with_capacity(2 * n),
            due: Vec::with_capacity(n),
            touched: Vec::with_capacity(n),
            ready: Vec::with_capacity(n),
            seen: vec![false; n],
            pending: Vec::with_capacity(n),
            pending_seen: vec![false; n],
            frames_out: 0,
            frames_in: 0,
            icmp: false,
            udp_drops: 0,
            rx_ring: VecDeque::new(),
            rx_irq_at: None,
            rx_last_irq: None,
            gro_held: Vec::new(),
            rx_interrupts: 0,
            rx_itr_state: costs
                .rx_adaptive
                .map(|(p, _)| crate::guest::itr::DynamicItr::new(&p)),
        }
    }

    /// The interval between receive interrupts now.
    fn rx_interval(&self) -> Time {
        match (self.rx_itr_state, self.costs.rx_adaptive) {
            (Some(st), Some((_, unit))) => Time::from(st.eitr >> 3) * unit,
            _ => self.costs.rx_itr,
        }
    }

    /// Frames reach this peer without a NIC (a host process behind the
    /// bridge and tap: `netif_rx` per frame), so no interrupt moderation
    /// and no GRO.
    pub fn without_nic(mut self) -> Self {
        self.costs.rx_itr = 0;
        self.costs.rx_adaptive = None;
        self.rx_itr_state = None;
        self
    }

    /// The receive path of frames from the tap runs in the sender's
    /// context, not on this host's CPUs: `tun_get_user` hands each frame to
    /// `netif_rx_ni`, which runs the NET_RX softirq at once in the calling
    /// thread (vhost-net's worker), so the bridge, IP and TCP or UDP
    /// receive of a frame a guest sent to a process on its own host are
    /// that thread's work. Returns the costs the sender now pays per frame
    /// (TCP segment, UDP datagram); this host keeps the process's wake-up
    /// and its own work.
    pub fn receive_in_sender_context(&mut self) -> (Time, Time) {
        let moved = (self.costs.rx_segment, self.costs.udp_rx);
        self.costs.rx_segment = 0;
        self.costs.udp_rx = 0;
        self.costs.gro_merge = 0;
        moved
    }

    /// A single-threaded peer with a raw ICMP socket on `flow` (ping's
    /// identifier): its datagrams go out as echo requests, and echo
    /// replies come back as datagrams.
    pub fn icmp(flow: u16, app: Box<dyn PeerApp>, costs: PeerCosts) -> Self {
        let mut p = Self::udp(flow, app, costs);
        p.icmp = true;
        p
    }

    /// A single-threaded peer with one UDP socket on `flow` and no TCP
    /// connections.
    pub fn udp(flow: u16, app: Box<dyn PeerApp>, costs: PeerCosts) -> Self {
        let mut p = PeerHost::new(vec![], flow, app, costs, 1);
        p.flows = 1;
        p
    }

    /// Whether frames of `flow` are this peer's.
    pub fn owns(&self, flow: u16) -> bool {
        flow >= self.first_flow && flow - self.first_flow < self.flows
    }

    /// The earliest time the peer must run without a frame arriving (its
    /// application's or a connection's timer).
    pub fn next_timer(&mut self) -> Option<Time> {
        while let Some(&Reverse((t, i))) = self.timer_heap.peek() {
            if self.timers[i] == Some(t) {
                break;
            }
            self.timer_heap.pop();
        }
        let conn = self.timer_heap.peek().map(|r| r.0 .0);
        conn.into_iter()
            .chain(self.app_timer)
            .chain(self.rx_irq_at)
            .min()
    }

    /// Queues connection `i`'s deadline `t`. A retransmission deadline
    /// moves with every ACK, leaving a stale entry each time: once stale
    /// entries outnumber the connections, they are dropped in place (they
    /// would only have been skipped), so the heap stays about as deep as
    /// the number of connections.
    fn push_timer(&mut self, t: Time, i: usize) {
        if self.timer_heap.len() >= 2 * self.timers.len() + 16 {
            let timers = &self.timers;
            self.timer_heap
                .retain(|&Reverse((t, i))| timers[i] == Some(t));
        }
        self.timer_heap.push(Reverse((t, i)));
    }

    /// Connection `i` received or timed out: the kernel has output to
    /// send, and the process has it ready.
    fn touch(&mut self, i: usize) {
        if !self.seen[i] {
            self.seen[i] = true;
            self.touched.push(i);
        }
        if !self.pending_seen[i] {
            self.pending_seen[i] = true;
            self.pending.push(i);
        }
    }

    fn cpu_of(&self, conn: usize) -> usize {
        conn % self.busy_until.len()
    }

    /// Its CPUs (threads): connection i is CPU i mod this.
    pub fn cpus(&self) -> usize {
        self.busy_until.len()
    }

    /// The CPU whose thread takes frame `f` (its connection's, or CPU 0
    /// for a datagram); `None` if the frame is not this peer's.
    pub fn cpu_of_frame(&self, f: &Frame) -> Option<usize> {
        let i = usize::from(f.flow.checked_sub(self.first_flow)?);
        (i < usize::from(self.flows)).then(|| self.cpu_of(i))
    }

    /// When CPU `cpu` finishes the work planned on it.
    pub fn busy_until(&self, cpu: usize) -> Time {
        self.busy_until[cpu]
    }

    /// CPU `cpu`'s planned work now ends at `t`: a peer whose CPUs are
    /// host threads under the host scheduler (`host.peer_cores`) resumes
    /// work it owed when its thread gets the core back.
    pub fn set_busy_until(&mut self, cpu: usize, t: Time) {
        self.busy_until[cpu] = t;
    }

    /// A frame reached the peer at `now`. Frames it sends in response are
    /// appended to `out` with the time each leaves. With interrupt
    /// moderation the frame waits in the RX ring for the next interrupt
    /// ([`Self::next_timer`]).
    pub fn receive(&mut self, f: Frame, now: Time, out: &mut Vec<(Time, Frame)>) {
        let interval = self.rx_interval();
        if interval == 0 && self.rx_itr_state.is_none() {
            self.ingest(f, 0, now, out);
            return;
        }
        self.rx_ring.push_back(f);
        if self.rx_irq_at.is_none() {
            // The interval counter runs from the last interrupt: a frame
            // after a quiet spell interrupts at once (82599 EITR, XL710
            // ITR).
            let earliest = self.rx_last_irq.map_or(now, |t| t + interval);
            self.rx_irq_at = Some(now.max(earliest));
        }
    }

    /// The moderated interrupt: NAPI takes every frame in the ring; GRO
    /// merges a connection's consecutive in-order data frames (same ACK,
    /// no longer than the held packet's segment size, below 64 KiB; a
    /// short or PSH frame sends the packet up) and sends what it holds up
    /// at the end of the poll (`napi_gro_flush`). ACKs and datagrams go up
    /// as they came, after their connection's held packet.
    fn rx_poll(&mut self, now: Time, out: &mut Vec<(Time, Frame)>) {
        self.rx_irq_at = None;
        self.rx_last_irq = Some(now);
        self.rx_interrupts += 1;
        if let Some(st) = &mut self.rx_itr_state {
            for f in &self.rx_ring {
                st.count(f.len());
            }
        }
        while let Some(f) = self.rx_ring.pop_front() {
            let conn = f
                .flow
                .checked_sub(self.first_flow)
                .map(usize::from)
                .filter(|&i| i < self.conns.len());
            let (Some(i), Transport::Tcp(seg)) = (conn, f.transport) else {
                self.ingest(f, 0, now, out);
                continue;
            };
            if self.costs.gro_off {
                self.ingest(f, f.gso_segs() - 1, now, out);
                continue;
            }
            let size = |f: &Frame, s: &crate::hw::wire::TcpSegment| {
                if f.gso_size > 0 {
                    u32::from(f.gso_size)
                } else {
                    s.len
                }
            };
            let held = self.gro_held.iter().position(|h| h.0 == i);
            if let Some(k) = held {
                let (_, hf, n, closed) = &mut self.gro_held[k];
                let Transport::Tcp(hs) = &mut hf.transport else {
                    unreachable!("GRO holds TCP packets only");
                };
                let fsize = size(&f, &seg);
                let hsize = if hf.gso_size > 0 {
                    u32::from(hf.gso_size)
                } else {
                    hs.len
                };
                let fits = u64::from(hs.len + seg.len)
                    < u64::from(crate::hw::wire::GSO_MAX_SIZE - crate::hw::wire::IP_TCP_HEADERS);
                if !*closed
                    && seg.len > 0
                    && !seg.fin
                    && !seg.syn
                    && seg.seq == hs.seq + u64::from(hs.len)
                    && seg.ack == hs.ack
                    && fsize <= hsize
                    && fits
                {
                    hs.len += seg.len;
                    hs.wnd = seg.wnd;
                    hs.psh = seg.psh;
                    hf.gso_size = u16::try_from(hsize).unwrap_or(u16::MAX);
                    *n += f.gso_segs();
                    // The last frame of a train may be short: what it
                    // closes goes up at the flush.
                    let last = seg.len - (f.gso_segs() - 1) * fsize;
                    *closed = seg.psh || last < hsize;
                    continue;
                }
                let (_, hf, n, _) = self.gro_held.remove(k);
                self.ingest(hf, n - 1, now, out);
            }
            if seg.len > 0 && !seg.psh && !seg.fin && !seg.syn {
                let n = f.gso_segs();
                let last = seg.len - (n - 1) * size(&f, &seg);
                let closed = last < size(&f, &seg);
                self.gro_held.push((i, f, n, closed));
            } else {
                self.ingest(f, f.gso_segs() - 1, now, out);
            }
        }
        let mut held = std::mem::take(&mut self.gro_held);
        for (_, f, n, _) in held.drain(..) {
            self.ingest(f, n - 1, now, out);
        }
        self.gro_held = held;
        // After napi_complete the driver updates the interval.
        if let (Some(st), Some((p, _))) = (&mut self.rx_itr_state, self.costs.rx_adaptive) {
            st.update(&p);
        }
    }

    /// A received packet (`merged` frames GRO joined to its first) goes
    /// up the peer's stack at `now`.
    fn ingest(&mut self, f: Frame, merged: u32, now: Time, out: &mut Vec<(Time, Frame)>) {
        let Some(i) = f.flow.checked_sub(self.first_flow).map(usize::from) else {
            return;
        };
        if let Some(d) = Datagram::of(&f) {
            if i >= usize::from(self.flows) {
                return;
            }
            self.frames_in += 1;
            let cpu = self.cpu_of(i);
            let busy = self.busy_until[cpu] > now;
            let idle = !busy && self.udp_rx.is_empty();
            let mut t = self.busy_until[cpu].max(now) + self.costs.udp_rx;
            if idle {
                t += self.costs.wakeup;
            }
            self.busy_until[cpu] = t;
            if self.udp_rx.len() >= PEER_UDP_RCVBUF_DATAGRAMS {
                self.udp_drops += 1;
                return;
            }
            self.udp_rx.push_back(d);
            self.run_app_when_free(cpu, busy, out);
            return;
        }
        let Transport::Tcp(seg) = f.transport else {
            return;
        };
        if i >= self.conns.len() {
            return;
        }
        self.frames_in += 1;
        let cpu = self.cpu_of(i);
        let busy = self.busy_until[cpu] > now;
        let mut t = self.busy_until[cpu].max(now)
            + self.costs.rx_segment
            + Time::from(merged) * self.costs.gro_merge;
        self.conns[i].on_segment(seg, t);
        if self.conns[i].readable() > 0 && !busy {
            t += self.costs.wakeup;
        }
        self.busy_until[cpu] = t;
        self.touch(i);
        self.run_app_when_free(cpu, busy, out);
    }

    /// Runs the process after a frame's receive path on `cpu`; but if the
    /// CPU was still busy with earlier work when the frame came (`busy`),
    /// only the kernel's part runs now (ACKs, window updates) and the
    /// process runs once the CPU is free. A process run early would see
    /// and act on a time the simulation has not reached: an open-loop
    /// generator would place requests not yet due, whose cost pushes its
    /// next run further ahead, and run away from the simulated clock.
    fn run_app_when_free(&mut self, cpu: usize, busy: bool, out: &mut Vec<(Time, Frame)>) {
        if busy {
            let from = self.busy_until[cpu];
            self.send_output(from, out);
            self.defer_app(self.busy_until[cpu]);
        } else {
            self.run_app(cpu, out);
        }
    }

    /// The process is due to run at `at`.
    fn defer_app(&mut self, at: Time) {
        self.app_timer = Some(self.app_timer.map_or(at, |t| t.min(at)));
    }

    /// A timer of the peer came due at `now`.
    pub fn timer(&mut self, now: Time, out: &mut Vec<(Time, Frame)>) {
        self.timer_on(now, None, out);
    }

    /// [`Self::timer`], the application running on CPU `on` if given
    /// (the one of the peer's host threads that holds a core), else on
    /// the least busy CPU.
    pub fn timer_on(&mut self, now: Time, on: Option<usize>, out: &mut Vec<(Time, Frame)>) {
        if self.rx_irq_at.is_some_and(|t| t <= now) {
            self.rx_poll(now, out);
            // An interrupt alone: the poll ran the process if it had work.
            let app_due = self.app_timer.is_some_and(|d| d <= now);
            let conn_due = self.timers.iter().flatten().any(|&t| t <= now);
            if !app_due && !conn_due {
                self.send_output(now, out);
                return;
            }
        }
        while let Some(&Reverse((t, i))) = self.timer_heap.peek() {
            if t > now {
                break;
            }
            self.timer_heap.pop();
            if self.timers[i] == Some(t) {
                self.timers[i] = None;
                self.due.push(i);
            }
        }
        // In connection order, as a scan of every connection would.
        self.due.sort_unstable();
        for k in 0..self.due.len() {
            let i = self.due[k];
            self.conns[i].on_timer(now);
            self.touch(i);
        }
        self.due.clear();
        if self.app_timer.is_some_and(|d| d <= now) {
            self.app_timer = None;
        }
        // The application runs on the least busy CPU, once that one is
        // free (see `run_app_when_free`).
        let cpu = on
            .filter(|&c| c < self.busy_until.len())
            .unwrap_or_else(|| {
                (0..self.busy_until.len())
                    .min_by_key(|&c| self.busy_until[c])
                    .unwrap_or(0)
            });
        if self.busy_until[cpu] > now {
            self.send_output(now, out);
            self.defer_app(self.busy_until[cpu]);
            return;
        }
        self.busy_until[cpu] = now;
        self.run_app(cpu, out);
    }

    fn run_app(&mut self, cpu: usize, out: &mut Vec<(Time, Frame)>) {
        // What arrived or timed out since the last poll: its ready list.
        self.ready.clear();
        for i in self.pending.drain(..) {
            self.pending_seen[i] = false;
            self.ready.push(i);
        }
        self.ready.sort_unstable();
        let mut io = PeerIo {
            conns: Conns::new(&mut self.conns, &mut self.touched, &mut self.seen)
                .with_ready(&self.ready),
            udp_rx: &mut self.udp_rx,
            udp_tx: &mut self.udp_tx,
        };
        let (cost, wake) = self.app.poll(&mut io, self.busy_until[cpu]);
        self.busy_until[cpu] += cost;
        // This poll was any deferred one; the process asks anew.
        self.app_timer = wake;
        for d in self.udp_tx.drain(..) {
            self.busy_until[cpu] += self.costs.udp_tx;
            self.frames_out += 1;
            let t = self.busy_until[cpu];
            out.push((
                t,
                if self.icmp {
                    Frame::icmp(d.flow, true, d.len, d.seq, t)
                } else {
                    Frame::udp(d.flow, d.len, d.seq, t)
                },
            ));
        }
        let from = self.busy_until[cpu];
        self.send_output(from, out);
    }

    /// Sends the touched connections' output, each on its CPU and not
    /// before `from`, and re-arms their timers.
    fn send_output(&mut self, from: Time, out: &mut Vec<(Time, Frame)>) {
        // Only connections that received, timed out or were acted on can
        // have output or new timers.
        while let Some(i) = self.touched.pop() {
            self.seen[i] = false;
            let c = self.cpu_of(i);
            let start = self.busy_until[c].max(from);
            self.busy_until[c] = start;
            while let Some(seg) = self.conns[i].poll_output(self.busy_until[c]) {
                self.busy_until[c] += self.costs.tx_segment;
                self.frames_out += 1;
                let t = self.busy_until[c];
                let (flow, mss) = (self.first_flow + i as u16, self.conns[i].config().mss);
                out.push((t, Frame::tcp_gso(flow, seg, mss, t)));
            }
            let next = self.conns[i].next_timer();
            if next != self.timers[i] {
                self.timers[i] = next;
                if let Some(t) = next {
                    self.push_timer(t, i);
                }
            }
        }
        out.sort_unstable_by_key(|x| x.0);
    }

    /// The warm-up is over.
    pub fn reset_metrics(&mut self) {
        self.app.reset_metrics();
    }

    /// Adds the application's metrics.
    pub fn metrics(&self, out: &mut Metrics) {
        self.app.metrics(out);
    }

    /// The application's latency distributions.
    pub fn latencies<'a>(&'a self, out: &mut Vec<crate::guest::app::LatencyFamily<'a>>) {
        self.app.latencies(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{SEC, US};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Reads every datagram (100 us each) and records when it ran.
    struct Reader(Rc<RefCell<Vec<(Time, usize)>>>);

    impl PeerApp for Reader {
        fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
            let n = io.udp_rx.drain(..).count();
            self.0.borrow_mut().push((now, n));
            (n as Time * 100 * US, None)
        }
        fn reset_metrics(&mut self) {}
        fn metrics(&self, _: &mut Metrics) {}
    }

    /// Does nothing: received data stays in the socket.
    struct Idle;

    impl PeerApp for Idle {
        fn poll(&mut self, _: &mut PeerIo, _: Time) -> (Time, Option<Time>) {
            (0, None)
        }
        fn reset_metrics(&mut self) {}
        fn metrics(&self, _: &mut Metrics) {}
    }

    /// Ten MSS frames of one connection, 1 us apart, into a peer whose NIC
    /// interrupts at most every `itr` (GRO off or on): the ACKs it sends
    /// and the interrupts it took.
    fn acks_for_ten_frames(itr: Time, gro_off: bool) -> (usize, u64) {
        use crate::guest::tcp::{Segment, TcpConfig};
        let costs = PeerCosts {
            rx_segment: US,
            rx_itr: itr,
            gro_off,
            ..PeerCosts::default()
        };
        let conn = Tcp::new(TcpConfig::default()).unwrap();
        let mut p = PeerHost::new(vec![conn], 1, Box::new(Idle), costs, 1);
        let mut out = vec![];
        p.timer(0, &mut out);
        out.clear();
        let mut acks = 0;
        for k in 0..10u64 {
            let now = k * US;
            let seg = Segment {
                seq: k * 1448,
                len: 1448,
                ack: 0,
                wnd: 1 << 20,
                psh: false,
                ..Default::default()
            };
            p.receive(Frame::tcp(1, seg, now), now, &mut out);
            while let Some(t) = p.next_timer().filter(|&t| t <= now) {
                p.timer(t, &mut out);
            }
            acks += out.len();
            out.clear();
        }
        while let Some(t) = p.next_timer() {
            p.timer(t, &mut out);
            acks += out.len();
            out.clear();
            if t > SEC {
                break;
            }
        }
        assert_eq!(p.conns[0].bytes_received(), 10 * 1448);
        (acks, p.rx_interrupts)
    }

    /// Without moderation a receiver in quick-ACK mode ACKs every frame;
    /// with a 50 us interval the first frame interrupts at once and the
    /// other nine wait for the next interrupt, where GRO merges them into
    /// one packet and one ACK.
    #[test]
    fn moderation_and_gro_make_one_ack_per_merged_packet() {
        assert_eq!(acks_for_ten_frames(0, false), (10, 0));
        assert_eq!(acks_for_ten_frames(50 * US, false), (2, 2));
    }

    /// With GRO off the same two interrupts take the ten frames, but the
    /// nine of the second poll go up one by one: TCP acknowledges them as
    /// single segments, several ACKs where GRO sent one.
    #[test]
    fn without_gro_a_poll_acks_its_frames_one_by_one() {
        let (acks, irqs) = acks_for_ten_frames(50 * US, true);
        assert_eq!(irqs, 2);
        assert!(acks >= 5, "{acks} ACKs");
    }

    #[test]
    fn a_busy_cpu_runs_the_process_when_it_is_free_not_earlier() {
        let runs = Rc::new(RefCell::new(vec![]));
        let costs = PeerCosts {
            udp_rx: US,
            wakeup: 2 * US,
            ..PeerCosts::default()
        };
        let mut p = PeerHost::udp(5, Box::new(Reader(runs.clone())), costs);
        let mut out = vec![];
        p.timer(0, &mut out);
        runs.borrow_mut().clear();
        // Idle: receive path and wake-up, then the process (busy to 103 us).
        p.receive(Frame::udp(5, 100, 1, 0), 0, &mut out);
        assert_eq!(*runs.borrow(), [(3 * US, 1)]);
        // Two more while it is busy: their receive paths queue behind it,
        // and the process runs when the CPU is free, not now.
        p.receive(Frame::udp(5, 100, 2, 0), 10 * US, &mut out);
        p.receive(Frame::udp(5, 100, 3, 0), 20 * US, &mut out);
        assert_eq!(runs.borrow().len(), 1);
        // It was due when the first of them was through (104 us), but the
        // CPU still had the second's receive path: later again.
        assert_eq!(p.next_timer(), Some(104 * US));
        p.timer(104 * US, &mut out);
        assert_eq!(runs.borrow().len(), 1);
        assert_eq!(p.next_timer(), Some(105 * US));
        p.timer(105 * US, &mut out);
        assert_eq!(*runs.borrow(), [(3 * US, 1), (105 * US, 2)]);
        assert_eq!(p.next_timer(), None);
    }
}
