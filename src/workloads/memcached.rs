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
use crate::guest::app::{App, Conns, LatencyFamily, Metrics, Sys, TaskStep};
use crate::guest::tcp::Tcp;
use std::collections::VecDeque;

/// Request and object sizes.
#[derive(Clone, Copy, Debug)]
pub struct MemcachedShape {
    /// Key bytes.
    pub key: u32,
    /// Value bytes (Twitter-like objects: a few hundred bytes).
    pub value: u32,
    /// Sets among requests: `sets.0` in every `sets.1` (DID's 4 gets per
    /// set: 1 in 5; memaslap's 9:1: 1 in 10).
    pub sets: (u64, u64),
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
        x % self.sets.1.max(1) < self.sets.0
    }

    /// The mix for a share of gets in percent: sets in every 10,000
    /// requests, in lowest terms (80% gets: 1 in 5).
    pub fn sets_for_get_pct(get_pct: f64) -> (u64, u64) {
        let sets = ((100.0 - get_pct.clamp(0.0, 100.0)) * 100.0).round() as u64;
        let g = gcd(sets, 10_000);
        (sets / g, 10_000 / g)
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

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
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
    /// Requests sent before the interval and unanswered at its start: the
    /// counters of the interval add up with it (`outstanding_at_start +
    /// sent = completed + outstanding`).
    outstanding_at_start: usize,
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
            outstanding_at_start: 0,
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

/// The reply-latency percentiles a client reports, in ms.
fn latency_family(latency: &LatencyHistogram) -> LatencyFamily<'_> {
    let metrics = [
        ("p50", 50.0),
        ("p90", 90.0),
        ("p95", 95.0),
        ("p99", 99.0),
        ("p999", 99.9),
    ]
    .into_iter()
    .map(|(name, p)| (format!("memcached.{name}_ms"), p, MS))
    .collect();
    LatencyFamily {
        hist: latency,
        metrics,
        mean: Some(("memcached.mean_ms".into(), MS)),
    }
}

/// A client's reply latencies and the requests it still waits for: the
/// percentile curve (p50 .. p99.9, for latency plots; p95 is DID's
/// metric), the mean, and the outstanding count.
fn latency_metrics(out: &mut Metrics, latency: &LatencyHistogram, outstanding: usize) {
    latency_family(latency).insert(out);
    // In ms like the percentiles beside it (latency.mean() is in ps).
    out.insert(
        "memcached.mean_ms".into(),
        if latency.count() == 0 {
            f64::NAN
        } else {
            latency.mean() as f64 / MS as f64
        },
    );
    out.insert("memcached.outstanding".into(), outstanding as f64);
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
        self.outstanding_at_start = self.outstanding.iter().map(|q| q.len()).sum();
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(latency_family(&self.latency));
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("memcached.offered".into(), self.offered as f64);
        out.insert(
            "memcached.outstanding_at_start".into(),
            self.outstanding_at_start as f64,
        );
        out.insert("memcached.sent".into(), self.sent as f64);
        out.insert("memcached.not_sent".into(), self.not_sent as f64);
        out.insert("memcached.backlog".into(), self.backlog.len() as f64);
        out.insert("memcached.backlog_peak".into(), self.backlog_peak as f64);
        out.insert("memcached.completed".into(), self.completed as f64);
        let outstanding = self.outstanding.iter().map(|q| q.len()).sum();
        latency_metrics(out, &self.latency, outstanding);
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

/// memaslap (ES2 §6.3), closed loop: `concurrency` requests in flight,
/// request k on connection k mod connections at the start, each re-issued
/// on its connection as soon as its reply is read. The connections belong
/// to the client's threads (the peer host's CPUs) round robin. Gets and
/// sets follow the shape's mix, by the same hash as the server parses.
/// Latency is from a request's write to its whole reply; `tps` the replies
/// per second.
pub struct MemaslapClient {
    shape: MemcachedShape,
    seed: u64,
    sent_n: Vec<u64>,
    /// Per connection: requests due to be written (their socket buffer
    /// was full).
    unsent: Vec<u32>,
    /// The connections with `unsent > 0` (bit i of word i / 64): a poll
    /// writes on these instead of looking at every connection.
    due: Vec<u64>,
    outstanding: Vec<VecDeque<(Time, u32, bool)>>,
    syscall: Time,
    latency: LatencyHistogram,
    completed: u64,
    gets: u64,
    first: Option<Time>,
    last: Time,
}

impl MemaslapClient {
    /// A client of `conns` connections keeping `concurrency` requests in
    /// flight.
    pub fn new(
        shape: MemcachedShape,
        seed: u64,
        conns: usize,
        concurrency: usize,
        syscall: Time,
    ) -> Self {
        let conns = conns.max(1);
        let unsent = (0..conns)
            .map(|i| (concurrency / conns + usize::from(i < concurrency % conns)) as u32)
            .collect::<Vec<_>>();
        let mut due = vec![0u64; conns.div_ceil(64)];
        for (i, &u) in unsent.iter().enumerate() {
            if u > 0 {
                due[i / 64] |= 1 << (i % 64);
            }
        }
        MemaslapClient {
            shape,
            seed,
            due,
            sent_n: vec![0; conns],
            outstanding: unsent
                .iter()
                .map(|&n| VecDeque::with_capacity(n as usize + 1))
                .collect(),
            unsent,
            syscall,
            latency: LatencyHistogram::new(),
            completed: 0,
            gets: 0,
            first: None,
            last: 0,
        }
    }

    /// Writes connection `i`'s due requests while its buffer has room.
    fn write(&mut self, i: usize, tcp: &mut Tcp, at: Time) -> Time {
        let mut cost = 0;
        while self.unsent[i] > 0 {
            let set = self.shape.is_set(self.seed, i, self.sent_n[i]);
            let (req, resp) = self.shape.sizes(set);
            if tcp.send_space() < req {
                break;
            }
            tcp.send(req);
            cost += self.syscall;
            self.sent_n[i] += 1;
            self.unsent[i] -= 1;
            self.outstanding[i].push_back((at + cost, resp, set));
        }
        if self.unsent[i] == 0 {
            self.due[i / 64] &= !(1 << (i % 64));
        }
        cost
    }

    /// Transactions per second over the measured interval (first to last
    /// reply).
    pub fn tps(&self) -> f64 {
        super::completion_rate(self.first, self.last, self.completed)
    }
}

impl PeerApp for MemaslapClient {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        let n = conns.len().min(self.sent_n.len());
        let mut cost = 0;
        for &i in conns.ready() {
            if i >= n {
                continue;
            }
            while let Some(&(sent, resp, set)) = self.outstanding[i].front() {
                if conns.peek(i).readable() < resp {
                    break;
                }
                conns.get(i).recv(resp);
                cost += self.syscall;
                let done = now + cost;
                self.latency.record(done.saturating_sub(sent));
                self.completed += 1;
                self.gets += u64::from(!set);
                self.first.get_or_insert(done);
                self.last = done;
                self.outstanding[i].pop_front();
                // Re-issued at once.
                self.unsent[i] += 1;
                self.due[i / 64] |= 1 << (i % 64);
            }
        }
        // The connections with requests due, in increasing order (a write
        // only ever clears its own bit).
        for w in 0..self.due.len() {
            let mut bits = self.due[w];
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i >= n {
                    break;
                }
                let at = now + cost;
                cost += self.write(i, conns.get(i), at);
            }
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.latency = LatencyHistogram::new();
        self.completed = 0;
        self.gets = 0;
        self.first = None;
        self.last = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(latency_family(&self.latency));
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("memcached.completed".into(), self.completed as f64);
        out.insert("memcached.tps".into(), self.tps());
        let pct = if self.completed > 0 {
            100.0 * self.gets as f64 / self.completed as f64
        } else {
            0.0
        };
        out.insert("memcached.get_pct".into(), pct);
        let outstanding = self.outstanding.iter().map(|q| q.len()).sum();
        latency_metrics(out, &self.latency, outstanding);
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
    /// The response whose request the worker is processing now: it is
    /// sent (the connection's index, its size) when that work is done.
    sending: Option<(usize, u32)>,
    /// The connections epoll_wait returned, in order, not yet drained
    /// (the kernel's ready list is consumed by every step, so the worker
    /// keeps its own), how far it is in them, and per connection whether
    /// it is among them.
    batch: Vec<usize>,
    batch_pos: usize,
    queued: Vec<bool>,
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
            sending: None,
            batch: Vec::with_capacity(conns),
            batch_pos: 0,
            queued: vec![false; conns],
            served: 0,
        }
    }
}

impl App for MemcachedWorker {
    /// memcached's worker loop (`drive_machine`): one epoll_wait, then
    /// the ready connections' requests one at a time: read it, process
    /// it, and `transmit()` its response with one sendmsg before the next
    /// request is read. A response leaves when its own work is done, not
    /// with the batch (issue 24 item 4).
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(conns) = sys.conns.as_mut() else {
            return TaskStep::Exit;
        };
        // The request just processed: its sendmsg.
        if let Some((k, resp)) = self.sending.take() {
            conns.get(k).tcp.send(resp);
        }
        // epoll_wait: what became ready joins the connections still to
        // serve (one call when the worker starts from none).
        let mut cost = if self.batch_pos >= self.batch.len() {
            self.syscall
        } else {
            0
        };
        for &k in conns.ready() {
            let Some(i) = conns
                .peek(k)
                .flow
                .checked_sub(self.first_flow)
                .map(usize::from)
            else {
                continue;
            };
            if i < self.served_n.len() && i % self.threads == self.thread && !self.queued[i] {
                self.queued[i] = true;
                self.batch.push(k);
            }
        }
        while let Some(&k) = self.batch.get(self.batch_pos) {
            let i = usize::from(conns.peek(k).flow - self.first_flow);
            let set = self.shape.is_set(self.seed, i, self.served_n[i]);
            let (req, resp) = self.shape.sizes(set);
            if conns.peek(k).tcp.readable() < req {
                // This connection is drained: the next one.
                self.queued[i] = false;
                self.batch_pos += 1;
                continue;
            }
            conns.get(k).tcp.recv(req);
            self.served_n[i] += 1;
            self.served += 1;
            self.sending = Some((k, resp));
            // read, the command, sendmsg.
            cost += 2 * self.syscall + if set { self.set_cost } else { self.get_cost };
            return TaskStep::Compute(cost);
        }
        self.batch.clear();
        self.batch_pos = 0;
        TaskStep::Block
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
            sets: (1, 5),
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
    fn the_mix_is_in_lowest_terms_and_keeps_dids_one_in_five() {
        assert_eq!(MemcachedShape::sets_for_get_pct(80.0), (1, 5));
        assert_eq!(MemcachedShape::sets_for_get_pct(90.0), (1, 10));
        assert_eq!(MemcachedShape::sets_for_get_pct(100.0), (0, 1));
        assert_eq!(MemcachedShape::sets_for_get_pct(0.0), (1, 1));
        // The same requests are sets as with the former 4-gets-per-set rule.
        let s = shape();
        for n in 0..1000u64 {
            let mut x = 7 ^ (3u64 << 40) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 30;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 27;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 31;
            assert_eq!(s.is_set(7, 3, n), x.is_multiple_of(5));
        }
    }

    /// Polls a memaslap client with `ready` connections that received.
    fn poll_ms(c: &mut MemaslapClient, conns: &mut [Tcp], ready: &[usize], now: Time) -> Time {
        let (mut touched, mut seen) = (vec![], vec![false; conns.len()]);
        let (mut rx, mut tx) = (VecDeque::new(), vec![]);
        let mut io = PeerIo {
            conns: Conns::new(conns, &mut touched, &mut seen).with_ready(ready),
            udp_rx: &mut rx,
            udp_tx: &mut tx,
        };
        c.poll(&mut io, now).0
    }

    #[test]
    fn memaslap_keeps_its_concurrency_in_flight_and_reissues_on_each_reply() {
        let cfg = TcpConfig {
            nagle: false,
            ..TcpConfig::default()
        };
        let shape = MemcachedShape {
            sets: MemcachedShape::sets_for_get_pct(90.0),
            ..shape()
        };
        // 5 requests over 2 connections: 3 on the first, 2 on the second.
        let mut c = MemaslapClient::new(shape, 1, 2, 5, 100);
        let mut client: Vec<Tcp> = vec![];
        let mut server: Vec<Tcp> = vec![];
        for _ in 0..2 {
            let (a, b) = Tcp::pair(cfg, cfg).unwrap();
            client.push(a);
            server.push(b);
        }
        poll_ms(&mut c, &mut client, &[], 0);
        assert_eq!(c.outstanding[0].len(), 3);
        assert_eq!(c.outstanding[1].len(), 2);
        // The server answers everything, many rounds.
        let mut served_sets = 0u64;
        let mut served = [0u64; 2];
        for round in 1..=200u64 {
            let now = round * 10 * US;
            for i in 0..2 {
                while let Some(seg) = client[i].poll_output(now) {
                    server[i].on_segment(seg, now);
                }
                loop {
                    let set = shape.is_set(1, i, served[i]);
                    let (req, resp) = shape.sizes(set);
                    if server[i].readable() < req {
                        break;
                    }
                    server[i].recv(req);
                    server[i].send(resp);
                    served[i] += 1;
                    served_sets += u64::from(set);
                }
                while let Some(seg) = server[i].poll_output(now) {
                    client[i].on_segment(seg, now);
                }
            }
            poll_ms(&mut c, &mut client, &[0, 1], now);
            // Always the concurrency in flight.
            let inflight: usize = c.outstanding.iter().map(|q| q.len()).sum();
            assert_eq!(inflight, 5, "round {round}");
        }
        let mut m = Metrics::new();
        c.metrics(&mut m);
        let done = m["memcached.completed"];
        assert_eq!(done, (served[0] + served[1]) as f64);
        assert!(done >= 5.0 * 199.0, "{done}");
        // About 90% gets.
        let gets = m["memcached.get_pct"];
        assert!((gets - 90.0).abs() < 3.0, "{gets}");
        assert_eq!(gets, 100.0 * (1.0 - served_sets as f64 / done));
        // 5 replies per 10 µs round.
        assert!(
            (m["memcached.tps"] - 5e5).abs() < 1e4,
            "{}",
            m["memcached.tps"]
        );
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
