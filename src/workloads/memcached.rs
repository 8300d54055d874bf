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
use crate::guest::app::{App, Metrics, Sys, TaskStep};
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

/// The load generator: Poisson arrivals at `rate`, spread round robin over
/// the connections; latency from the scheduled send to the whole response.
pub struct MemcachedClient {
    shape: MemcachedShape,
    seed: u64,
    rng: RngStream,
    rate: f64,
    next_send: Time,
    rr: usize,
    sent_n: Vec<u64>,
    outstanding: Vec<VecDeque<(Time, u32)>>,
    syscall: Time,
    latency: LatencyHistogram,
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
            next_send: 0,
            rr: 0,
            sent_n: vec![0; conns],
            outstanding: (0..conns).map(|_| VecDeque::with_capacity(64)).collect(),
            syscall,
            latency: LatencyHistogram::new(),
            completed: 0,
            within_10ms: 0,
        }
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
        while self.next_send <= now && !conns.is_empty() {
            let i = self.rr % conns.len();
            self.rr += 1;
            let n = self.sent_n[i];
            self.sent_n[i] += 1;
            let (req, resp) = self.shape.sizes(self.shape.is_set(self.seed, i, n));
            conns.get(i).send(req);
            self.outstanding[i].push_back((self.next_send, resp));
            cost += self.syscall;
            let gap = self.rng.exponential(1.0 / self.rate);
            self.next_send += ((gap * SEC as f64) as Time).max(1);
        }
        (cost, Some(self.next_send))
    }

    fn reset_metrics(&mut self) {
        self.latency = LatencyHistogram::new();
        self.completed = 0;
        self.within_10ms = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("memcached.completed".into(), self.completed as f64);
        out.insert(
            "memcached.p95_ms".into(),
            self.latency.percentile(95.0) as f64 / MS as f64,
        );
        out.insert("memcached.mean_us".into(), self.latency.mean() as f64 / 1e6);
        let backlog: usize = self.outstanding.iter().map(|q| q.len()).sum();
        out.insert("memcached.outstanding".into(), backlog as f64);
        let ok = if self.completed + backlog as u64 > 0 {
            self.within_10ms as f64 / (self.completed + backlog as u64) as f64
        } else {
            0.0
        };
        // Requests still unanswered at the end count as late.
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
