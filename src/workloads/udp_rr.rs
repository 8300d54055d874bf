//! netperf UDP_RR (vcanal.md §4): one `msg`-byte request, one equal
//! response, then the next request; the client records each round trip
//! (netperf reports the mean). The client is in the VM or on the client
//! host; the other end echoes. These are the programs of the kernel-socket
//! paths (virtio-net, the VF, bare metal); vCanal's in-guest side is
//! [`super::vcanal`], and its peers are the same as these.

use super::netperf::NetperfCosts;
use super::peer::{PeerApp, PeerIo};
use crate::engine::{as_us, LatencyHistogram, Time};
use crate::guest::app::{
    insert_percentiles_us, App, Datagram, LatencyFamily, Metrics, Sys, TaskStep,
};

/// The round-trip distribution behind `rr_metrics`' percentiles.
fn rr_latencies<'a>(out: &mut Vec<LatencyFamily<'a>>, rtt: &'a LatencyHistogram) {
    if rtt.count() > 0 {
        out.push(LatencyFamily::us("udp_rr.latency", rtt).with_mean_us("udp_rr.latency_us"));
    }
}

fn rr_metrics(out: &mut Metrics, rtt: &LatencyHistogram, transactions: u64) {
    out.insert("udp_rr.transactions".into(), transactions as f64);
    if rtt.count() > 0 {
        out.insert("udp_rr.latency_us".into(), as_us(rtt.mean()));
        insert_percentiles_us(out, "udp_rr.latency", rtt);
    }
}

/// The UDP_RR client in the guest: sendto, then recvfrom (blocking) the
/// response.
pub struct UdpRrClient {
    flow: u16,
    msg: u32,
    costs: NetperfCosts,
    sent_at: Option<Time>,
    seq: u64,
    rtt: LatencyHistogram,
    transactions: u64,
}

impl UdpRrClient {
    /// A client of `msg`-byte transactions on `flow`.
    pub fn new(flow: u16, msg: u32, costs: NetperfCosts) -> Self {
        UdpRrClient {
            flow,
            msg,
            costs,
            sent_at: None,
            seq: 0,
            rtt: LatencyHistogram::new(),
            transactions: 0,
        }
    }
}

impl App for UdpRrClient {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let mut cost = 0;
        if let Some(t0) = self.sent_at {
            // recvfrom: only the response to the outstanding request.
            let Some(d) = sys.recv() else {
                return TaskStep::Block;
            };
            cost += self.costs.call(d.len);
            self.rtt.record((sys.now + cost).saturating_sub(t0));
            self.transactions += 1;
            self.seq += 1;
        }
        let d = Datagram {
            flow: self.flow,
            len: self.msg,
            seq: self.seq,
            sent: 0,
        };
        if sys.udp_send(d) {
            self.sent_at = Some(sys.now + cost);
            cost += self.costs.call(self.msg);
        } else {
            self.sent_at = None;
        }
        TaskStep::Compute(cost.max(1))
    }

    fn reset_metrics(&mut self) {
        self.rtt = LatencyHistogram::new();
        self.transactions = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        rr_latencies(out, &self.rtt);
    }

    fn metrics(&self, out: &mut Metrics) {
        rr_metrics(out, &self.rtt, self.transactions);
    }
}

/// The UDP_RR server in the guest (netserver): recvfrom, sendto back.
pub struct UdpRrServer {
    costs: NetperfCosts,
    served: u64,
}

impl UdpRrServer {
    /// A server whose calls cost `costs`.
    pub fn new(costs: NetperfCosts) -> Self {
        UdpRrServer { costs, served: 0 }
    }
}

impl App for UdpRrServer {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(d) = sys.recv() else {
            return TaskStep::Block;
        };
        sys.udp_send(d);
        self.served += 1;
        TaskStep::Compute(2 * self.costs.call(d.len))
    }

    fn reset_metrics(&mut self) {
        self.served = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("udp_rr.served".into(), self.served as f64);
    }
}

/// netserver on the client host: echoes each request.
pub struct UdpRrEcho {
    syscall: Time,
}

impl UdpRrEcho {
    /// An echo whose recvfrom and sendto cost `syscall` each.
    pub fn new(syscall: Time) -> Self {
        UdpRrEcho { syscall }
    }
}

impl PeerApp for UdpRrEcho {
    fn poll(&mut self, io: &mut PeerIo, _now: Time) -> (Time, Option<Time>) {
        let mut cost = 0;
        while let Some(d) = io.udp_rx.pop_front() {
            cost += 2 * self.syscall;
            io.udp_tx.push(d);
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {}

    fn metrics(&self, _out: &mut Metrics) {}
}

/// netperf UDP_RR's client on the client host: one request outstanding.
pub struct UdpRrPeerClient {
    flow: u16,
    msg: u32,
    syscall: Time,
    sent_at: Option<Time>,
    seq: u64,
    start: Time,
    rtt: LatencyHistogram,
    transactions: u64,
}

impl UdpRrPeerClient {
    /// The first request at `start` instead of at once.
    pub fn starting_at(mut self, start: Time) -> Self {
        self.start = start;
        self
    }

    /// A client of `msg`-byte transactions on `flow`.
    pub fn new(flow: u16, msg: u32, syscall: Time) -> Self {
        UdpRrPeerClient {
            flow,
            msg,
            syscall,
            sent_at: None,
            seq: 0,
            start: 0,
            rtt: LatencyHistogram::new(),
            transactions: 0,
        }
    }
}

impl PeerApp for UdpRrPeerClient {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        if now < self.start {
            return (0, Some(self.start));
        }
        let mut cost = 0;
        let mut answered = self.sent_at.is_none();
        while let Some(d) = io.udp_rx.pop_front() {
            cost += self.syscall;
            // netperf does not look into the response: any datagram
            // answers the one request outstanding.
            let _ = d;
            if let Some(t0) = self.sent_at.take() {
                self.rtt.record((now + cost).saturating_sub(t0));
                self.transactions += 1;
                self.seq += 1;
                answered = true;
            }
        }
        if answered {
            io.udp_tx.push(Datagram {
                flow: self.flow,
                len: self.msg,
                seq: self.seq,
                sent: now + cost,
            });
            self.sent_at = Some(now + cost);
            cost += self.syscall;
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.rtt = LatencyHistogram::new();
        self.transactions = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        rr_latencies(out, &self.rtt);
    }

    fn metrics(&self, out: &mut Metrics) {
        rr_metrics(out, &self.rtt, self.transactions);
    }
}
