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
    touched: Vec<usize>,
    seen: Vec<bool>,
    /// The connections that received or timed out before the app's poll.
    ready: Vec<usize>,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames received.
    pub frames_in: u64,
}

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
            frames_out: 0,
            frames_in: 0,
        }
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
        conn.into_iter().chain(self.app_timer).min()
    }

    fn touch(&mut self, i: usize) {
        if !self.seen[i] {
            self.seen[i] = true;
            self.touched.push(i);
        }
    }

    fn cpu_of(&self, conn: usize) -> usize {
        conn % self.busy_until.len()
    }

    /// A frame reached the peer at `now`. Frames it sends in response are
    /// appended to `out` with the time each leaves.
    pub fn receive(&mut self, f: Frame, now: Time, out: &mut Vec<(Time, Frame)>) {
        let Some(i) = f.flow.checked_sub(self.first_flow).map(usize::from) else {
            return;
        };
        if let Some(d) = Datagram::of(&f) {
            if i >= usize::from(self.flows) {
                return;
            }
            self.frames_in += 1;
            let cpu = self.cpu_of(i);
            let idle = self.busy_until[cpu] <= now && self.udp_rx.is_empty();
            let mut t = self.busy_until[cpu].max(now) + self.costs.udp_rx;
            if idle {
                t += self.costs.wakeup;
            }
            self.busy_until[cpu] = t;
            self.udp_rx.push_back(d);
            self.run_app(cpu, out);
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
        let idle = self.busy_until[cpu] <= now;
        let mut t = self.busy_until[cpu].max(now) + self.costs.rx_segment;
        self.conns[i].on_segment(seg, t);
        if self.conns[i].readable() > 0 && idle {
            t += self.costs.wakeup;
        }
        self.busy_until[cpu] = t;
        self.touch(i);
        self.run_app(cpu, out);
    }

    /// A timer of the peer came due at `now`.
    pub fn timer(&mut self, now: Time, out: &mut Vec<(Time, Frame)>) {
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
        // The application runs on the least busy CPU.
        let cpu = (0..self.busy_until.len())
            .min_by_key(|&c| self.busy_until[c])
            .unwrap_or(0);
        self.busy_until[cpu] = self.busy_until[cpu].max(now);
        self.run_app(cpu, out);
    }

    fn run_app(&mut self, cpu: usize, out: &mut Vec<(Time, Frame)>) {
        // What arrived or timed out since the last poll: its ready list.
        self.ready.clear();
        self.ready.extend_from_slice(&self.touched);
        self.ready.sort_unstable();
        let mut io = PeerIo {
            conns: Conns::new(&mut self.conns, &mut self.touched, &mut self.seen)
                .with_ready(&self.ready),
            udp_rx: &mut self.udp_rx,
            udp_tx: &mut self.udp_tx,
        };
        let (cost, wake) = self.app.poll(&mut io, self.busy_until[cpu]);
        self.busy_until[cpu] += cost;
        if wake.is_some() {
            self.app_timer = wake;
        }
        for d in self.udp_tx.drain(..) {
            self.busy_until[cpu] += self.costs.udp_tx;
            self.frames_out += 1;
            let t = self.busy_until[cpu];
            out.push((t, Frame::udp(d.flow, d.len, d.seq, t)));
        }
        // Only connections that received, timed out or were acted on can
        // have output or new timers.
        while let Some(i) = self.touched.pop() {
            self.seen[i] = false;
            let c = self.cpu_of(i);
            let start = self.busy_until[c].max(self.busy_until[cpu]);
            self.busy_until[c] = start;
            while let Some(seg) = self.conns[i].poll_output(self.busy_until[c]) {
                self.busy_until[c] += self.costs.tx_segment;
                self.frames_out += 1;
                let t = self.busy_until[c];
                out.push((t, Frame::tcp(self.first_flow + i as u16, seg, t)));
            }
            let next = self.conns[i].next_timer();
            if next != self.timers[i] {
                self.timers[i] = next;
                if let Some(t) = next {
                    self.timer_heap.push(Reverse((t, i)));
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
}
