//! UDP PacketGen (DID §5.2): an external sender at a fixed packet rate and an
//! in-guest receiver at the lowest priority.

use crate::engine::{as_us, LatencyHistogram, Time, SEC};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};

/// Ethernet (14) + IPv4 (20) + UDP (8) header bytes in front of the payload.
pub const HEADERS: u32 = 42;

/// The external client host's sender: one datagram every 1/rate seconds.
pub struct UdpSender {
    interval: Time,
    /// Frame length on the wire, without FCS (what the NIC counts).
    pub frame_bytes: u32,
    /// Datagrams sent.
    pub sent: u64,
    next: Time,
    frac: f64,
    step: f64,
}

impl UdpSender {
    /// A sender of `payload`-byte datagrams at `rate_pps`.
    pub fn new(rate_pps: f64, payload: u32) -> Self {
        let step = SEC as f64 / rate_pps;
        UdpSender {
            interval: step as Time,
            frame_bytes: payload + HEADERS,
            sent: 0,
            next: 0,
            frac: 0.0,
            step,
        }
    }

    /// Time of the next send after this one (keeps the exact mean rate
    /// despite integer picoseconds).
    pub fn advance(&mut self) -> Time {
        self.sent += 1;
        self.frac += self.step - self.interval as f64;
        let extra = self.frac.floor();
        self.frac -= extra;
        self.next += self.interval + extra as Time;
        self.next
    }
}

/// The in-guest receiver: recv() in a loop, one datagram per call.
pub struct UdpReceiver {
    recv_cost: Time,
    /// Datagrams received by the application.
    pub received: u64,
    latency: LatencyHistogram,
    pending: Option<Time>,
}

impl UdpReceiver {
    /// A receiver whose recv() costs `recv_cost` per datagram.
    pub fn new(recv_cost: Time) -> Self {
        UdpReceiver {
            recv_cost,
            received: 0,
            latency: LatencyHistogram::new(),
            pending: None,
        }
    }
}

impl App for UdpReceiver {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        if let Some(sent) = self.pending.take() {
            self.received += 1;
            self.latency.record(sys.now.saturating_sub(sent));
        }
        match sys.recv() {
            Some(d) => {
                self.pending = Some(d.sent);
                TaskStep::Compute(self.recv_cost)
            }
            None => TaskStep::Block,
        }
    }

    fn reset_metrics(&mut self) {
        self.received = 0;
        self.latency = LatencyHistogram::new();
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(
            LatencyFamily::us("udp.latency", &self.latency).with_mean_us("udp.latency_mean_us"),
        );
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("udp.received".into(), self.received as f64);
        out.insert("udp.latency_mean_us".into(), as_us(self.latency.mean()));
        // The percentile curve (p50 .. p99.9), for latency plots.
        insert_percentiles_us(out, "udp.latency", &self.latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_keeps_the_exact_mean_rate() {
        let mut s = UdpSender::new(600_000.0, 128);
        let mut t = 0;
        for _ in 0..600_000 {
            t = s.advance();
        }
        assert!((t as i64 - SEC as i64).abs() < 2, "{t}");
        assert_eq!(s.frame_bytes, 170);
    }
}
