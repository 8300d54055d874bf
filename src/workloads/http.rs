//! A static web server in the VM and ApacheBench on the client host
//! (ES2 §6.3 nginx RPS, §6.4 Apache served time).
//!
//! Each ab process keeps `concurrency` connections, one request in flight
//! on each: it writes a request, reads the whole response, records the
//! time from its write to the response's last byte (what ab's "served
//! within" percentiles count) and writes the next request at once
//! (closed loop). **Keep-alive** (`ab -k`): the TCP model has no
//! connection set-up or teardown, so connections stay open; real ab without
//! `-k` would add a three-way handshake and a FIN exchange per request.
//!
//! The server has two shapes over the same request handling
//! ([`serve`]):
//! * nginx ([`HttpWorker`]): `workers` processes, each an epoll loop over
//!   its own port's connections; ab process p talks to worker
//!   p mod workers;
//! * Apache worker/prefork ([`HttpThread`]): one thread per connection,
//!   blocked in read() until its request arrives.
//!
//! Connection i belongs to ab process i mod ab_processes (the client host
//! runs connection i's segments on CPU i mod ab_processes, the process's).

use super::peer::{PeerApp, PeerIo};
use crate::engine::{as_us, LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};
use crate::guest::tcp::Tcp;

/// Request and response sizes.
#[derive(Clone, Copy, Debug)]
pub struct HttpShape {
    /// Request bytes.
    pub request: u32,
    /// Response bytes: header and page.
    pub response: u32,
}

/// The server's costs per request.
#[derive(Clone, Copy, Debug)]
pub struct ServerCosts {
    /// The server's own work per request (parse, lookup, header build,
    /// logging).
    pub request: Time,
    /// One system call's entry and exit.
    pub syscall: Time,
    /// Copying one KiB between user and kernel.
    pub copy_per_kib: Time,
}

impl ServerCosts {
    /// One request: read() it, the server's work, write the response
    /// (header and page in one writev).
    fn per_request(&self, shape: &HttpShape) -> Time {
        2 * self.syscall
            + self.request
            + self.copy_per_kib * u64::from(shape.request + shape.response) / 1024
    }
}

/// Serves every whole request `tcp` holds; returns how many and their CPU
/// time. A partial request waits for the rest.
pub fn serve(tcp: &mut Tcp, shape: &HttpShape, costs: &ServerCosts) -> (u64, Time) {
    let (mut n, mut cost) = (0, 0);
    while tcp.readable() >= shape.request {
        tcp.recv(shape.request);
        tcp.send(shape.response);
        n += 1;
        cost += costs.per_request(shape);
    }
    (n, cost)
}

/// The connections of ab process `ab` among `conns` (interleaved: i mod
/// `processes`).
pub fn ab_process_of(conn: usize, processes: usize) -> usize {
    conn % processes.max(1)
}

/// An nginx worker: an epoll loop over the connections whose flow index
/// (from `first_flow`) is in its port's share (`owner[i] == worker`).
pub struct HttpWorker {
    shape: HttpShape,
    costs: ServerCosts,
    worker: usize,
    first_flow: u16,
    owner: Vec<usize>,
    /// Requests served.
    pub served: u64,
    prefix: &'static str,
}

impl HttpWorker {
    /// Worker `worker`; connection i is served by worker `owner[i]`.
    pub fn new(
        shape: HttpShape,
        costs: ServerCosts,
        worker: usize,
        first_flow: u16,
        owner: Vec<usize>,
        prefix: &'static str,
    ) -> Self {
        HttpWorker {
            shape,
            costs,
            worker,
            first_flow,
            owner,
            served: 0,
            prefix,
        }
    }
}

impl App for HttpWorker {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(conns) = sys.conns.as_mut() else {
            return TaskStep::Exit;
        };
        // One epoll_wait, then every ready connection of its port.
        let mut cost = self.costs.syscall;
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
            if self.owner.get(i) != Some(&self.worker)
                || conns.peek(k).tcp.readable() < self.shape.request
            {
                continue;
            }
            let (n, c) = serve(&mut conns.get(k).tcp, &self.shape, &self.costs);
            self.served += n;
            cost += c;
            any = true;
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
        out.insert(
            format!("{}.served.worker{}", self.prefix, self.worker),
            self.served as f64,
        );
    }
}

/// An Apache thread serving one connection: blocked in read() until a
/// request arrives.
pub struct HttpThread {
    shape: HttpShape,
    costs: ServerCosts,
    /// Requests served.
    pub served: u64,
    prefix: &'static str,
}

impl HttpThread {
    /// A thread for one connection.
    pub fn new(shape: HttpShape, costs: ServerCosts, prefix: &'static str) -> Self {
        HttpThread {
            shape,
            costs,
            served: 0,
            prefix,
        }
    }
}

impl App for HttpThread {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(tcp) = sys.tcp.as_deref_mut() else {
            return TaskStep::Exit;
        };
        let (n, cost) = serve(tcp, &self.shape, &self.costs);
        if n == 0 {
            return TaskStep::Block;
        }
        self.served += n;
        TaskStep::Compute(cost)
    }

    fn reset_metrics(&mut self) {
        self.served = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        *out.entry(format!("{}.served", self.prefix)).or_insert(0.0) += self.served as f64;
    }
}

/// How the client's metrics are named: `nginx.latency_p50_us` or
/// `apache.served_p50_us`.
#[derive(Clone, Copy, Debug)]
pub struct ClientNames {
    /// Metric prefix (`nginx`, `apache`).
    pub prefix: &'static str,
    /// The percentile family (`latency`, `served`).
    pub percentiles: &'static str,
}

/// ApacheBench processes on the client host: closed loop, one request in
/// flight per connection.
pub struct AbClient {
    shape: HttpShape,
    /// Per connection: when its request in flight was written.
    in_flight: Vec<Option<Time>>,
    /// Per connection: the request is still to be written (its socket
    /// buffer was full).
    unsent: Vec<bool>,
    per_request: Time,
    names: ClientNames,
    latency: LatencyHistogram,
    completed: u64,
    first: Option<Time>,
    last: Time,
}

impl AbClient {
    /// ab over `conns` connections; each request costs it `per_request`
    /// of CPU (write, poll, read and parse, statistics).
    pub fn new(shape: HttpShape, conns: usize, per_request: Time, names: ClientNames) -> Self {
        AbClient {
            shape,
            in_flight: vec![None; conns],
            unsent: vec![true; conns],
            per_request,
            names,
            latency: LatencyHistogram::new(),
            completed: 0,
            first: None,
            last: 0,
        }
    }

    fn write(&mut self, i: usize, tcp: &mut Tcp, at: Time) -> bool {
        if tcp.send_space() < self.shape.request {
            self.unsent[i] = true;
            return false;
        }
        tcp.send(self.shape.request);
        self.in_flight[i] = Some(at);
        self.unsent[i] = false;
        true
    }

    /// Requests completed per second over the measured interval (first
    /// to last completion).
    pub fn rps(&self) -> f64 {
        super::completion_rate(self.first, self.last, self.completed)
    }
}

impl PeerApp for AbClient {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        let mut cost = 0;
        let n = conns.len().min(self.in_flight.len());
        // Responses on the connections that received.
        for &i in conns.ready() {
            if i >= n {
                continue;
            }
            if let Some(t0) = self.in_flight[i] {
                if conns.peek(i).readable() >= self.shape.response {
                    conns.get(i).recv(self.shape.response);
                    cost += self.per_request;
                    let done = now + cost;
                    self.latency.record(done.saturating_sub(t0));
                    self.completed += 1;
                    self.first.get_or_insert(done);
                    self.last = done;
                    self.in_flight[i] = None;
                    self.unsent[i] = true;
                }
            }
        }
        // Every connection without a request in flight writes the next.
        for i in 0..n {
            if self.unsent[i] && self.in_flight[i].is_none() {
                let at = now + cost;
                self.write(i, conns.get(i), at);
            }
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.latency = LatencyHistogram::new();
        self.completed = 0;
        self.first = None;
        self.last = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        let p = self.names.prefix;
        let prefix = format!("{p}.{}", self.names.percentiles);
        let mean = format!("{prefix}_mean_us");
        out.push(LatencyFamily::us(&prefix, &self.latency).with_mean_us(&mean));
    }

    fn metrics(&self, out: &mut Metrics) {
        let p = self.names.prefix;
        out.insert(format!("{p}.rps"), self.rps());
        out.insert(format!("{p}.completed"), self.completed as f64);
        let prefix = format!("{p}.{}", self.names.percentiles);
        insert_percentiles_us(out, &prefix, &self.latency);
        out.insert(
            format!("{p}.{}_mean_us", self.names.percentiles),
            as_us(self.latency.mean()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::US;
    use crate::guest::app::Conns;
    use crate::guest::tcp::TcpConfig;
    use std::collections::VecDeque;

    fn shape() -> HttpShape {
        HttpShape {
            request: 100,
            response: 850,
        }
    }

    fn costs() -> ServerCosts {
        ServerCosts {
            request: 8 * US,
            syscall: 150_000,
            copy_per_kib: 100_000,
        }
    }

    fn pair() -> (Tcp, Tcp) {
        let cfg = TcpConfig {
            nagle: false,
            ..TcpConfig::default()
        };
        Tcp::pair(cfg, cfg).unwrap()
    }

    /// Moves every segment between `a` and `b` until both are quiet.
    fn exchange(a: &mut Tcp, b: &mut Tcp, now: Time) {
        loop {
            let mut moved = false;
            while let Some(s) = a.poll_output(now) {
                b.on_segment(s, now);
                moved = true;
            }
            while let Some(s) = b.poll_output(now) {
                a.on_segment(s, now);
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    #[test]
    fn serve_answers_whole_requests_only() {
        let (mut c, mut s) = pair();
        c.send(250);
        exchange(&mut c, &mut s, 0);
        // Two whole requests, half of a third.
        let (n, cost) = serve(&mut s, &shape(), &costs());
        assert_eq!(n, 2);
        // 2 × (2 syscalls + 8 µs + 950 bytes copied).
        assert_eq!(cost, 2 * (300_000 + 8 * US + 100_000 * 950 / 1024));
        assert_eq!(s.readable(), 50);
        exchange(&mut c, &mut s, 0);
        assert_eq!(c.readable(), 1700);
    }

    #[test]
    fn ab_keeps_one_request_in_flight_per_connection_and_times_it() {
        let names = ClientNames {
            prefix: "nginx",
            percentiles: "latency",
        };
        let mut ab = AbClient::new(shape(), 2, US, names);
        let (c0, mut s0) = pair();
        let (c1, mut s1) = pair();
        let poll = |ab: &mut AbClient, c: &mut [Tcp], ready: &[usize], now| {
            let (mut touched, mut seen) = (vec![], vec![false; c.len()]);
            let (mut rx, mut tx) = (VecDeque::new(), vec![]);
            let mut io = PeerIo {
                conns: Conns::new(c, &mut touched, &mut seen).with_ready(ready),
                udp_rx: &mut rx,
                udp_tx: &mut tx,
            };
            ab.poll(&mut io, now)
        };
        let mut cs = [c0, c1];
        // Start: one request on each connection, nothing more.
        poll(&mut ab, &mut cs, &[], 0);
        poll(&mut ab, &mut cs, &[], 0);
        exchange(&mut cs[0], &mut s0, 0);
        exchange(&mut cs[1], &mut s1, 0);
        assert_eq!(s0.readable(), 100);
        assert_eq!(s1.readable(), 100);
        // Connection 0 answered at 30 µs: timed, and the next one written.
        serve(&mut s0, &shape(), &costs());
        exchange(&mut cs[0], &mut s0, 30 * US);
        let (cost, _) = poll(&mut ab, &mut cs, &[0], 30 * US);
        assert_eq!(cost, US);
        exchange(&mut cs[0], &mut s0, 31 * US);
        assert_eq!(s0.readable(), 100, "the next request");
        assert_eq!(s1.readable(), 100, "still the first");
        let mut m = Metrics::new();
        ab.metrics(&mut m);
        assert_eq!(m["nginx.completed"], 1.0);
        assert!((m["nginx.latency_p50_us"] - 31.0).abs() < 0.5, "{m:?}");
    }

    #[test]
    fn ab_processes_own_interleaved_connections() {
        assert_eq!(
            (0..8).map(|i| ab_process_of(i, 4)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0, 1, 2, 3]
        );
        assert_eq!(ab_process_of(5, 0), 0);
    }
}
