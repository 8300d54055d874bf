//! NetPIPE (DID §5.5): TCP ping-pong of fixed-size messages; the reported
//! latency is half the round trip. The transmitter runs on the peer host
//! (the external load generator, or a process on the VM's host behind the
//! bridge) and the receiver echoes each message from inside the guest.

use super::peer::{PeerApp, PeerIo};
use crate::engine::{LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};

/// The peer's transmitter: send a message, wait for the whole echo, record
/// half the round trip, repeat.
pub struct NetpipeTransmitter {
    msg: u32,
    syscall: Time,
    sent_at: Option<Time>,
    half_rtt: LatencyHistogram,
    /// Round trips completed.
    pub round_trips: u64,
}

impl NetpipeTransmitter {
    /// A transmitter of `msg`-byte messages whose send and recv calls cost
    /// `syscall` each.
    pub fn new(msg: u32, syscall: Time) -> Self {
        NetpipeTransmitter {
            msg,
            syscall,
            sent_at: None,
            half_rtt: LatencyHistogram::new(),
            round_trips: 0,
        }
    }
}

impl PeerApp for NetpipeTransmitter {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        if conns.is_empty() {
            return (0, None);
        }
        let tcp = conns.get(0);
        let mut cost = 0;
        if let Some(t0) = self.sent_at {
            if tcp.readable() < self.msg {
                return (0, None);
            }
            tcp.recv(self.msg);
            cost += self.syscall;
            self.round_trips += 1;
            self.half_rtt.record((now + cost - t0) / 2);
        }
        let t = now + cost;
        if tcp.send(self.msg) == self.msg {
            self.sent_at = Some(t);
            cost += self.syscall;
        } else {
            self.sent_at = None;
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.half_rtt = LatencyHistogram::new();
        self.round_trips = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(
            LatencyFamily::us("netpipe.half_rtt", &self.half_rtt)
                .with_mean_us("netpipe.half_rtt_us"),
        );
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("netpipe.round_trips".into(), self.round_trips as f64);
        out.insert("netpipe.half_rtt_us".into(), self.half_rtt.mean_us());
        // The percentile curve (p50 .. p99.9), for latency plots.
        insert_percentiles_us(out, "netpipe.half_rtt", &self.half_rtt);
    }
}

/// The in-guest receiver: read a whole message, send it back.
pub struct NetpipeEcho {
    msg: u32,
    syscall: Time,
    /// Messages echoed.
    pub echoed: u64,
}

impl NetpipeEcho {
    /// An echo of `msg`-byte messages; recv and send cost `syscall` each.
    pub fn new(msg: u32, syscall: Time) -> Self {
        NetpipeEcho {
            msg,
            syscall,
            echoed: 0,
        }
    }
}

impl App for NetpipeEcho {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        if sys.tcp_readable() < self.msg {
            return TaskStep::Block;
        }
        sys.tcp_recv(self.msg);
        sys.tcp_send(self.msg);
        self.echoed += 1;
        TaskStep::Compute(2 * self.syscall)
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("netpipe.echoed".into(), self.echoed as f64);
    }

    fn reset_metrics(&mut self) {
        self.echoed = 0;
    }
}
