//! UDP PacketGen (DID §5.2): an external sender at a fixed packet rate and an
//! in-guest receiver at the lowest priority.

use crate::engine::{LatencyHistogram, Time, SEC};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};

/// Ethernet (14) + IPv4 (20) + UDP (8) header bytes in front of the payload.
pub const HEADERS: u32 = 42;

/// The external client host's sender, the paper's user-level PacketGen: a
/// lowest-priority process that sleeps, wakes and sends `burst` datagrams
/// back to back (each one the sending host's sendto path, `spacing`), then
/// sleeps until the next burst is due. Bursts start every `burst / rate`
/// seconds, so the mean rate is the configured one; a burst that takes
/// longer than that (the process is CPU-bound) starts the next one late.
/// `burst = 1` is a perfectly periodic sender, one datagram every 1/rate.
pub struct UdpSender {
    interval: Time,
    /// Frame length on the wire, without FCS (what the NIC counts).
    pub frame_bytes: u32,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams per wake-up.
    burst: u32,
    /// Between two datagrams of one burst: the sender's sendto path.
    spacing: Time,
    /// Datagrams of the current burst sent so far.
    in_burst: u32,
    /// When the current burst was due.
    due: Time,
    next: Time,
    frac: f64,
    step: f64,
}

impl UdpSender {
    /// A periodic sender of `payload`-byte datagrams at `rate_pps`.
    pub fn new(rate_pps: f64, payload: u32) -> Self {
        Self::bursty(rate_pps, payload, 1, 0)
    }

    /// A sender of `payload`-byte datagrams at `rate_pps` in bursts of
    /// `burst`, `spacing` apart within a burst.
    pub fn bursty(rate_pps: f64, payload: u32, burst: u32, spacing: Time) -> Self {
        let burst = burst.max(1);
        let step = SEC as f64 * burst as f64 / rate_pps;
        UdpSender {
            interval: step as Time,
            frame_bytes: payload + HEADERS,
            sent: 0,
            burst,
            spacing,
            in_burst: 0,
            due: 0,
            next: 0,
            frac: 0.0,
            step,
        }
    }

    /// Time of the next send after this one (keeps the exact mean rate
    /// despite integer picoseconds).
    pub fn advance(&mut self) -> Time {
        self.sent += 1;
        self.in_burst += 1;
        if self.in_burst < self.burst {
            self.next += self.spacing;
            return self.next;
        }
        // The burst is out: sleep until the next one is due (or go on at
        // once if this burst overran it).
        self.in_burst = 0;
        self.frac += self.step - self.interval as f64;
        let extra = self.frac.floor();
        self.frac -= extra;
        self.due += self.interval + extra as Time;
        let free = self.next + self.spacing;
        self.next = if self.burst > 1 {
            self.due.max(free)
        } else {
            self.due
        };
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
        out.insert("udp.latency_mean_us".into(), self.latency.mean_us());
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

    #[test]
    fn bursts_keep_the_mean_rate_and_leave_spacing_apart() {
        // 100K pps in bursts of 8, 900 ns apart: a burst every 80 us.
        let mut s = UdpSender::bursty(100_000.0, 128, 8, 900_000);
        let mut sends = vec![0];
        for _ in 0..100_000 {
            sends.push(s.advance());
        }
        assert_eq!(sends[1] - sends[0], 900_000);
        assert_eq!(sends[7] - sends[0], 7 * 900_000);
        assert_eq!(sends[8], 80 * crate::engine::US);
        assert_eq!(sends[16], 160 * crate::engine::US);
        // 100,000 datagrams = 12,500 bursts: the last one due at 1 s.
        assert!(
            (sends[100_000] as i64 - SEC as i64).abs() < 2,
            "{}",
            sends[100_000]
        );
    }

    #[test]
    fn a_burst_longer_than_its_period_delays_the_next() {
        // 1 Mpps in bursts of 4 at 2 us each: 8 us of sending per 4 us.
        let mut s = UdpSender::bursty(1_000_000.0, 128, 4, 2 * crate::engine::US);
        let t: Vec<Time> = (0..5).map(|_| s.advance()).collect();
        assert_eq!(t[3], 8 * crate::engine::US);
        assert_eq!(t[4], 10 * crate::engine::US);
    }
}
