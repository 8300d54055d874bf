//! Memcached (DID §5.7): a memcached server in the VM (worker threads, each
//! serving its share of the connections from an epoll loop) and a load
//! generator with many TCP connections (Nagle off) sending gets and sets
//! 4:1 at a target rate, open loop. The reported figure of merit is the
//! highest rate at which 95% of requests finish within 10 ms, found by
//! searching over the rate (`search` in the experiment file).
//!
//! Both ends frame requests the same way without sharing state: request
//! number n on connection c is a get or a set by a hash of (seed, c, n),
//! which the client uses to build it and the server to parse it.

use super::peer::{PeerApp, PeerIo};
use crate::engine::{LatencyHistogram, RngStream, Time, MS, SEC};
use crate::guest::app::{App, Conns, Metrics, Sys, TaskStep};
use crate::guest::tcp::Tcp;
use std::collections::VecDeque;

/// Request and object sizes.
#[derive(Clone, Copy, Debug)]
pub struct MemcachedShape {
    /// Key bytes.
    pub key: u32,
    /// Value bytes (Twitter-like objects: a few hundred bytes).
    pub value: u32,
    /// Gets per set.
    pub gets_per_set: u32,
}

impl MemcachedShape {
    /// Whether request `n` on connection `conn` is a set.
    fn is_set(&self, seed: u64, conn: usize, n: u64) -> bool {
        let mut x = seed ^ ((conn as u64) << 40) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // splitmix64 finalizer
        x ^= x >> 30;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        x.is_multiple_of(u64::from(self.gets_per_set + 1))
    }

    /// (request bytes, response bytes) of a get or a set (text protocol).
    fn sizes(&self, set: bool) -> (u32, u32) {
        if set {
            // "set <key> 0 0 <len>\r\n<value>\r\n" → "STORED\r\n"
            (self.key + self.value + 24, 8)
        } else {
            // "get <key>\r\n" → "VALUE <key> 0 <len>\r\n<value>\r\nEND\r\n"
            (self.key + 6, self.key + self.value + 24)
        }
    }
}

/// Requests a connection may have written and not yet seen answered
/// (mutilate's `--depth`): a deeper pipeline only means a request
/// hundreds of milliseconds late, far past the 10 ms bound, and a bound
/// keeps the generator's per-connection state finite whatever the rate.
pub const PIPELINE_DEPTH: usize = 256;

/// Requests due but not yet written that the generator keeps (its
/// user-space queue, for when every connection's pipeline or socket buffer
/// is full); an arrival that finds it full is never sent and is counted
/// (`memcached.not_sent`).
pub const BACKLOG_LIMIT: usize = 4096;

/// The load generator: Poisson arrivals at `rate`, each written to the
/// next connection (round robin) with room in its pipeline and socket
/// buffer; latency from the scheduled arrival to the whole response, so a
/// request that waited in the backlog counts its wait.
///
/// Arrivals are drawn only up to the time the generator runs (its peer
/// host runs it when its CPU is free): what it offers is the Poisson
/// process at `rate`, however far behind it falls, and its state is
/// bounded by [`BACKLOG_LIMIT`] and [`PIPELINE_DEPTH`] per connection.
pub struct MemcachedClient {
    shape: MemcachedShape,
    seed: u64,
    rng: RngStream,
    rate: f64,
    next_arrival: Time,
    /// Scheduled times of the arrivals not yet written, oldest first.
    backlog: VecDeque<Time>,
    /// Every connection was full at the last try: only a segment arriving
    /// (a response, an ACK) makes room.
    full: bool,
    rr: usize,
    sent_n: Vec<u64>,
    outstanding: Vec<VecDeque<(Time, u32)>>,
    syscall: Time,
    latency: LatencyHistogram,
    offered: u64,
    sent: u64,
    not_sent: u64,
    backlog_peak: usize,
    completed: u64,
    within_10ms: u64,
}

impl MemcachedClient {
    /// A client of `conns` connections at `rate` requests/s.
    pub fn new(shape: MemcachedShape, seed: u64, conns: usize, rate: f64, syscall: Time) -> Self {
        MemcachedClient {
            shape,
            seed,
            rng: RngStream::new(seed, "memcached-arrivals"),
            rate,
            next_arrival: 0,
            backlog: VecDeque::with_capacity(64),
            full: false,
            rr: 0,
            sent_n: vec![0; conns],
            outstanding: (0..conns).map(|_| VecDeque::with_capacity(64)).collect(),
            syscall,
            latency: LatencyHistogram::new(),
            offered: 0,
            sent: 0,
            not_sent: 0,
            backlog_peak: 0,
            completed: 0,
            within_10ms: 0,
        }
    }

    /// The arrivals due by `now` join the backlog (or are dropped when it
    /// is full).
    fn arrivals(&mut self, now: Time) {
        while self.next_arrival <= now {
            self.offered += 1;
            if self.backlog.len() < BACKLOG_LIMIT {
                self.backlog.push_back(self.next_arrival);
                self.backlog_peak = self.backlog_peak.max(self.backlog.len());
            } else {
                self.not_sent += 1;
            }
            let gap = self.rng.exponential(1.0 / self.rate) * SEC as f64;
            self.next_arrival += (gap.round() as Time).max(1);
        }
    }

    /// The next connection, round robin after the last one used, with
    /// room for its next request; with that request's and its response's
    /// sizes.
    fn writable(&self, conns: &Conns<Tcp>) -> Option<(usize, u32, u32)> {
        let n = conns.len();
        (0..n).map(|k| (self.rr + k) % n).find_map(|i| {
            let set = self.shape.is_set(self.seed, i, self.sent_n[i]);
            let (req, resp) = self.shape.sizes(set);
            (self.outstanding[i].len() < PIPELINE_DEPTH && conns.peek(i).send_space() >= req)
                .then_some((i, req, resp))
        })
    }
}

impl PeerApp for MemcachedClient {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        let mut cost = 0;
        for &i in conns.ready() {
            while let Some(&(sent, resp)) = self.outstanding[i].front() {
                if conns.peek(i).readable() < resp {
                    break;
                }
                conns.get(i).recv(resp);
                cost += self.syscall;
                let lat = (now + cost).saturating_sub(sent);
                self.latency.record(lat);
                self.completed += 1;
                if lat <= 10 * MS {
                    self.within_10ms += 1;
                }
                self.outstanding[i].pop_front();
            }
        }
        self.arrivals(now);
        self.full &= conns.ready().is_empty();
        while let Some(&at) = self.backlog.front() {
            if self.full {
                break;
            }
            let Some((i, req, resp)) = self.writable(conns) else {
                // Every pipeline or socket buffer is full: a response or
                // an ACK runs the generator again.
                self.full = true;
                break;
            };
            self.rr = i + 1;
            let took = conns.get(i).send(req);
            debug_assert_eq!(took, req);
            self.sent_n[i] += 1;
            self.sent += 1;
            self.outstanding[i].push_back((at, resp));
            self.backlog.pop_front();
            cost += self.syscall;
        }
        (cost, Some(self.next_arrival))
    }

    fn reset_metrics(&mut self) {
        self.latency = LatencyHistogram::new();
        self.offered = 0;
        self.sent = 0;
        self.not_sent = 0;
        self.backlog_peak = self.backlog.len();
        self.completed = 0;
        self.within_10ms = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("memcached.offered".into(), self.offered as f64);
        out.insert("memcached.sent".into(), self.sent as f64);
        out.insert("memcached.not_sent".into(), self.not_sent as f64);
        out.insert("memcached.backlog".into(), self.backlog.len() as f64);
        out.insert("memcached.backlog_peak".into(), self.backlog_peak as f64);
        out.insert("memcached.completed".into(), self.completed as f64);
        // The percentile curve (p50 .. p99.9), for latency plots; p95 is
        // the paper's metric.
        for (name, p) in [
            ("p50", 50.0),
            ("p90", 90.0),
            ("p95", 95.0),
            ("p99", 99.0),
            ("p999", 99.9),
        ] {
            out.insert(
                format!("memcached.{name}_ms"),
                self.latency.percentile(p) as f64 / MS as f64,
            );
        }
        out.insert("memcached.mean_us".into(), self.latency.mean() as f64 / 1e6);
        let outstanding: usize = self.outstanding.iter().map(|q| q.len()).sum();
        out.insert("memcached.outstanding".into(), outstanding as f64);
        // Requests unanswered at the end (written or still waiting) and
        // those never sent count as late.
        let late = (outstanding + self.backlog.len()) as u64 + self.not_sent;
        let all = self.completed + late;
        let ok = if all > 0 {
            self.within_10ms as f64 / all as f64
        } else {
            0.0
        };
        out.insert("memcached.within_10ms_pct".into(), 100.0 * ok);
    }
}

/// One memcached worker thread: serves the connections whose flow index is
/// `thread` modulo `threads`.
pub struct MemcachedWorker {
    shape: MemcachedShape,
    seed: u64,
    thread: usize,
    threads: usize,
    first_flow: u16,
    served_n: Vec<u64>,
    get_cost: Time,
    set_cost: Time,
    syscall: Time,
    /// Requests served.
    pub served: u64,
}

impl MemcachedWorker {
    /// Worker `thread` of `threads` for `conns` connections from flow
    /// `first_flow`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shape: MemcachedShape,
        seed: u64,
        thread: usize,
        threads: usize,
        conns: usize,
        first_flow: u16,
        costs: (Time, Time, Time),
    ) -> Self {
        MemcachedWorker {
            shape,
            seed,
            thread,
            threads,
            first_flow,
            served_n: vec![0; conns],
            get_cost: costs.0,
            set_cost: costs.1,
            syscall: costs.2,
            served: 0,
        }
    }
}

impl App for MemcachedWorker {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(conns) = sys.conns.as_mut() else {
            return TaskStep::Exit;
        };
        // One epoll_wait, then every ready connection's requests.
        let mut cost = self.syscall;
        let mut any = false;
        for &k in conns.ready() {
            let Some(i) = conns
                .peek(k)
                .flow
                .checked_sub(self.first_flow)
                .map(usize::from)
            else {
                continue;
            };
            if i >= self.served_n.len() || i % self.threads != self.thread {
                continue;
            }
            loop {
                let set = self.shape.is_set(self.seed, i, self.served_n[i]);
                let (req, resp) = self.shape.sizes(set);
                if conns.peek(k).tcp.readable() < req {
                    break;
                }
                let s = conns.get(k);
                s.tcp.recv(req);
                s.tcp.send(resp);
                self.served_n[i] += 1;
                self.served += 1;
                any = true;
                cost += 2 * self.syscall + if set { self.set_cost } else { self.get_cost };
            }
        }
        if !any {
            return TaskStep::Block;
        }
        TaskStep::Compute(cost)
    }

    fn reset_metrics(&mut self) {
        self.served = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        let k = format!("memcached.served.thread{}", self.thread);
        out.insert(k, self.served as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::US;
    use crate::guest::tcp::TcpConfig;
    use std::collections::VecDeque;

    fn shape() -> MemcachedShape {
        MemcachedShape {
            key: 30,
            value: 400,
            gets_per_set: 4,
        }
    }

    /// Polls `c` at `now` over `conns` (nothing received), returning the
    /// CPU time and the wake-up it asked for.
    fn poll(c: &mut MemcachedClient, conns: &mut [Tcp], now: Time) -> (Time, Option<Time>) {
        let (mut touched, mut seen) = (vec![], vec![false; conns.len()]);
        let (mut rx, mut tx) = (VecDeque::new(), vec![]);
        let mut io = PeerIo {
            conns: Conns::new(conns, &mut touched, &mut seen),
            udp_rx: &mut rx,
            udp_tx: &mut tx,
        };
        c.poll(&mut io, now)
    }

    fn metric(c: &MemcachedClient, k: &str) -> f64 {
        let mut m = Metrics::new();
        c.metrics(&mut m);
        m[k]
    }

    #[test]
    fn arrivals_are_drawn_up_to_the_poll_and_no_further() {
        let mut conns: Vec<Tcp> = (0..4)
            .map(|_| Tcp::new(TcpConfig::default()).unwrap())
            .collect();
        let rate = 1e6;
        let mut c = MemcachedClient::new(shape(), 1, conns.len(), rate, 0);
        // Polled at each arrival it asks for, and at 1 ms.
        let mut now = 0;
        loop {
            let (_, w) = poll(&mut c, &mut conns, now);
            let wake = w.expect("an open-loop client always has a next arrival");
            assert!(wake > now, "asked for {wake} at {now}");
            if now == MS {
                break;
            }
            now = wake.min(MS);
        }
        // The arrivals in [0, 1 ms]: the one at 0 and a Poisson count of
        // mean rate × 1 ms = 1000.
        let offered = metric(&c, "memcached.offered");
        assert!((offered - 1001.0).abs() < 5.0 * 1000f64.sqrt(), "{offered}");
        assert_eq!(metric(&c, "memcached.sent"), offered);
        assert_eq!(metric(&c, "memcached.backlog"), 0.0);
    }

    #[test]
    fn a_client_that_cannot_write_keeps_a_bounded_backlog_and_counts_the_rest() {
        // Nothing is ever answered: two connections fill their pipelines.
        let mut conns: Vec<Tcp> = (0..2)
            .map(|_| Tcp::new(TcpConfig::default()).unwrap())
            .collect();
        let rate = 1e7;
        let mut c = MemcachedClient::new(shape(), 1, conns.len(), rate, 150);
        let mut now = 0;
        while now <= 10 * MS {
            poll(&mut c, &mut conns, now);
            now += 10 * US;
        }
        let offered = metric(&c, "memcached.offered");
        let sent = metric(&c, "memcached.sent");
        let backlog = metric(&c, "memcached.backlog");
        let not_sent = metric(&c, "memcached.not_sent");
        // 1e7/s for 10 ms: 100,000 arrivals, give or take the Poisson count.
        assert!((offered - 1e5).abs() < 5.0 * 1e5f64.sqrt(), "{offered}");
        assert_eq!(sent, (2 * PIPELINE_DEPTH) as f64);
        assert_eq!(metric(&c, "memcached.outstanding"), sent);
        assert_eq!(backlog, BACKLOG_LIMIT as f64);
        assert_eq!(metric(&c, "memcached.backlog_peak"), BACKLOG_LIMIT as f64);
        assert_eq!(sent + backlog + not_sent, offered);
        // Every request offered and not answered counts as late.
        assert_eq!(metric(&c, "memcached.within_10ms_pct"), 0.0);
    }
}
