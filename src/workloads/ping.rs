//! ping (ES2 §6.4): the client host sends an ICMP echo request every
//! `interval`; the guest kernel answers it in its receive softirq
//! (`icmp_rcv` → `icmp_echo` → `ip_push_pending_frames`; no task wakes
//! up) and the client records the round trip from the timestamp the reply
//! carries back (ping's payload) to its receipt by the ping process.

use super::peer::{PeerApp, PeerIo};
use crate::engine::{LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, Datagram, LatencyFamily, Metrics};

/// The ping process on the client host (a raw ICMP socket: its datagrams
/// leave as echo requests, echo replies come back as datagrams).
pub struct PingClient {
    flow: u16,
    payload: u32,
    interval: Time,
    /// Its own work per request sent and per reply read (system call,
    /// gettimeofday, statistics).
    syscall: Time,
    next: Time,
    seq: u64,
    /// The first sequence number of the measured interval.
    first_seq: u64,
    rtt: LatencyHistogram,
    sent: u64,
    received: u64,
}

impl PingClient {
    /// A client on `flow` sending `payload`-byte requests every
    /// `interval`, the first at `start`.
    pub fn new(flow: u16, payload: u32, interval: Time, start: Time, syscall: Time) -> Self {
        PingClient {
            flow,
            payload,
            interval: interval.max(1),
            syscall,
            next: start,
            seq: 0,
            first_seq: 0,
            rtt: LatencyHistogram::new(),
            sent: 0,
            received: 0,
        }
    }
}

impl PeerApp for PingClient {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let mut cost = 0;
        while let Some(d) = io.udp_rx.pop_front() {
            cost += self.syscall;
            // Replies to requests of the measured interval only.
            if d.flow == self.flow && d.seq >= self.first_seq && d.seq < self.seq {
                self.received += 1;
                self.rtt.record((now + cost).saturating_sub(d.sent));
            }
        }
        if now >= self.next {
            cost += self.syscall;
            io.udp_tx.push(Datagram {
                flow: self.flow,
                len: self.payload,
                seq: self.seq,
                sent: now + cost,
            });
            self.seq += 1;
            self.sent += 1;
            self.next += self.interval;
            while self.next <= now {
                // A client far behind skips, as ping's timer would.
                self.next += self.interval;
            }
        }
        (cost, Some(self.next))
    }

    fn reset_metrics(&mut self) {
        self.rtt = LatencyHistogram::new();
        self.sent = 0;
        self.received = 0;
        self.first_seq = self.seq;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(LatencyFamily::us("ping.rtt", &self.rtt).with_mean_us("ping.rtt_mean_us"));
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("ping.sent".into(), self.sent as f64);
        out.insert("ping.received".into(), self.received as f64);
        insert_percentiles_us(out, "ping.rtt", &self.rtt);
        out.insert("ping.rtt_mean_us".into(), self.rtt.mean_us());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{MS, US};
    use crate::guest::app::Conns;
    use std::collections::VecDeque;

    fn poll(
        c: &mut PingClient,
        rx: &mut VecDeque<Datagram>,
        tx: &mut Vec<Datagram>,
        now: Time,
    ) -> (Time, Option<Time>) {
        let (mut touched, mut seen) = (vec![], vec![]);
        let mut io = PeerIo {
            conns: Conns::new(&mut [], &mut touched, &mut seen),
            udp_rx: rx,
            udp_tx: tx,
        };
        c.poll(&mut io, now)
    }

    #[test]
    fn one_request_per_interval_and_the_rtt_from_the_echoed_timestamp() {
        let mut c = PingClient::new(1, 56, MS, 0, US);
        let (mut rx, mut tx) = (VecDeque::new(), vec![]);
        // Woken early (a reply of nothing): no request before its time.
        assert_eq!(poll(&mut c, &mut rx, &mut tx, 0).1, Some(MS));
        assert_eq!(tx.len(), 1);
        assert_eq!(poll(&mut c, &mut rx, &mut tx, MS / 2).1, Some(MS));
        assert_eq!(tx.len(), 1);
        // The reply of request 0 (stamped at 1 µs) read at 50 µs + 1 µs.
        let mut reply = tx[0];
        assert_eq!((reply.seq, reply.len, reply.sent), (0, 56, US));
        reply.sent = US;
        rx.push_back(reply);
        poll(&mut c, &mut rx, &mut tx, 50 * US);
        // A reply of a request never sent is not counted.
        rx.push_back(Datagram { seq: 7, ..reply });
        poll(&mut c, &mut rx, &mut tx, 60 * US);
        let mut m = Metrics::new();
        c.metrics(&mut m);
        assert_eq!(m["ping.sent"], 1.0);
        assert_eq!(m["ping.received"], 1.0);
        assert!((m["ping.rtt_p50_us"] - 50.0).abs() < 0.5, "{m:?}");
        // The second request at 1 ms.
        assert_eq!(poll(&mut c, &mut rx, &mut tx, MS).1, Some(2 * MS));
        assert_eq!(tx[1].seq, 1);
    }

    #[test]
    fn after_the_warm_up_only_new_requests_count() {
        let mut c = PingClient::new(1, 56, MS, 0, 0);
        let (mut rx, mut tx) = (VecDeque::new(), vec![]);
        poll(&mut c, &mut rx, &mut tx, 0);
        c.reset_metrics();
        // The reply to the warm-up's request arrives after the reset.
        rx.push_back(tx[0]);
        poll(&mut c, &mut rx, &mut tx, 10 * US);
        let mut m = Metrics::new();
        c.metrics(&mut m);
        assert_eq!((m["ping.sent"], m["ping.received"]), (0.0, 0.0));
    }
}
