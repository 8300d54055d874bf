//! A static web server in the VM and ApacheBench on the client host
//! (ES2 §6.3 nginx RPS, §6.4 Apache served time).
//!
//! Each ab process keeps `concurrency` connections, one request in flight
//! on each: it writes a request, reads the whole response, records the
//! time from its write to the response's last byte (what ab's "served
//! within" percentiles count) and writes the next request at once
//! (closed loop).
//!
//! **Keep-alive.** With `ab -k` ([`HttpShape::keep_alive`]) a connection
//! stays open and carries one request after another. Without it (ab's
//! default) every request has its own connection, as ab 2.3 runs it
//! (`start_connect`, `read_connection`, `close_connection`): ab connects
//! (non-blocking, the SYN), writes the request once the SYN-ACK has
//! connected it, reads the response until the server closes (an
//! HTTP/1.0 request without keep-alive: the server's FIN ends the
//! response), closes, and opens the next connection. The time it records
//! runs from the connect to the close. The server accepts the connection
//! once the handshake is done, serves the one request and closes first
//! (so its end goes to TIME_WAIT).
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
use crate::engine::{LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};
use crate::guest::tcp::{Tcp, TcpState};

/// Whether `tcp`'s send buffer takes `bytes`.
fn send_ok(tcp: &Tcp, bytes: u32) -> bool {
    tcp.send_space() >= bytes
}

/// Request and response sizes.
#[derive(Clone, Copy, Debug)]
pub struct HttpShape {
    /// Request bytes.
    pub request: u32,
    /// Response bytes: header and page.
    pub response: u32,
    /// Connections carry request after request (`ab -k`); otherwise one
    /// connection per request.
    pub keep_alive: bool,
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
    /// Taking a connection off the accept queue: the system calls
    /// (accept4, and nginx's epoll_ctl ADD) and the kernel's accept.
    pub accept: Time,
    /// Closing a connection: the system call and `tcp_close`.
    pub close: Time,
    /// The server's own work per connection (set-up and tear-down).
    pub connection: Time,
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

/// [`serve`], and without keep-alive the close that follows the one
/// request (HTTP/1.0: the server closes first).
fn serve_and_close(tcp: &mut Tcp, shape: &HttpShape, costs: &ServerCosts) -> (u64, Time) {
    let (n, mut cost) = serve(tcp, shape, costs);
    if n > 0 && !shape.keep_alive {
        tcp.close();
        cost += costs.close;
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
            let tcp = &conns.peek(k).tcp;
            // ngx_event_accept: the listener was readable.
            let accept = tcp.accept_pending();
            let request = tcp.readable() >= self.shape.request && !tcp.is_closed_by_app();
            if self.owner.get(i) != Some(&self.worker) || !(accept || request) {
                continue;
            }
            let tcp = &mut conns.get(k).tcp;
            if accept {
                tcp.accept();
                cost += self.costs.accept + self.costs.connection;
            }
            if request {
                let (n, c) = serve_and_close(tcp, &self.shape, &self.costs);
                self.served += n;
                cost += c;
            }
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
        // The thread takes its own connections off the accept queue (the
        // worker MPM's listener thread hands them over: a named
        // simplification).
        let mut cost = 0;
        let accepted = tcp.accept();
        if accepted {
            cost += self.costs.accept + self.costs.connection;
        }
        let (n, c) = if tcp.is_closed_by_app() {
            (0, 0)
        } else {
            serve_and_close(tcp, &self.shape, &self.costs)
        };
        cost += c;
        if n == 0 && !accepted {
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

/// A connection slot of ab without keep-alive; times are when its
/// connect began (the request's start, as ab times it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// To connect at this poll.
    Idle,
    /// SYN sent.
    Connecting(Time),
    /// Request written, reading the response.
    Waiting(Time),
    /// Closed at the last poll; its FIN goes out before the next connect.
    Closing,
}

/// ApacheBench processes on the client host: closed loop, one request in
/// flight per connection.
pub struct AbClient {
    shape: HttpShape,
    /// Without keep-alive: each connection slot's phase.
    slots: Vec<Slot>,
    /// The kernel's work to open and to close a connection.
    connect_cost: Time,
    close_cost: Time,
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
            slots: vec![Slot::Idle; conns],
            connect_cost: 0,
            close_cost: 0,
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

    /// The kernel's cost of `connect` (with the socket's creation) and of
    /// `close`, paid per request when the shape has no keep-alive.
    pub fn connection_costs(mut self, connect: Time, close: Time) -> Self {
        self.connect_cost = connect;
        self.close_cost = close;
        self
    }

    /// ab without keep-alive: connect, request once connected, read to the
    /// server's close, close, and the next connect at the following poll.
    fn poll_per_request(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        let mut cost = 0;
        let n = conns.len().min(self.slots.len());
        // Connections closed at the last poll have sent their FIN: their
        // slots open the next connection (from a new port; the old one's
        // last ACK is the kernel's affair).
        for slot in &mut self.slots[..n] {
            if *slot == Slot::Closing {
                *slot = Slot::Idle;
            }
        }
        let mut closed = false;
        for &i in conns.ready() {
            if i >= n {
                continue;
            }
            let tcp = conns.peek(i);
            match self.slots[i] {
                Slot::Connecting(t0) if tcp.is_connected() && send_ok(tcp, self.shape.request) => {
                    // The SYN-ACK came: connect() is done; write the request.
                    conns.get(i).send(self.shape.request);
                    self.slots[i] = Slot::Waiting(t0);
                }
                Slot::Waiting(t0)
                    if tcp.readable() >= self.shape.response
                        && tcp.state() == TcpState::CloseWait =>
                {
                    // The response ends with the server's FIN.
                    let tcp = conns.get(i);
                    tcp.recv(self.shape.response);
                    tcp.close();
                    cost += self.per_request + self.close_cost;
                    let done = now + cost;
                    self.latency.record(done.saturating_sub(t0));
                    self.completed += 1;
                    self.first.get_or_insert(done);
                    self.last = done;
                    self.slots[i] = Slot::Closing;
                    closed = true;
                }
                _ => {}
            }
        }
        for i in 0..n {
            if self.slots[i] != Slot::Idle {
                continue;
            }
            let cfg = *conns.peek(i).config();
            if let Ok(t) = Tcp::connect(cfg) {
                *conns.get(i) = t;
                cost += self.connect_cost;
                self.slots[i] = Slot::Connecting(now + cost);
            }
        }
        (cost, closed.then_some(now + cost))
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
        if !self.shape.keep_alive {
            return self.poll_per_request(io, now);
        }
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
            self.latency.mean_us(),
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
            keep_alive: true,
        }
    }

    fn costs() -> ServerCosts {
        ServerCosts {
            request: 8 * US,
            syscall: 150_000,
            copy_per_kib: 100_000,
            accept: 2 * US,
            close: 3 * US,
            connection: 5 * US,
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

    /// One poll of `ab` over the connections `c`, `ready` the ones with news.
    fn poll(ab: &mut AbClient, c: &mut [Tcp], ready: &[usize], now: Time) -> (Time, Option<Time>) {
        let (mut touched, mut seen) = (vec![], vec![false; c.len()]);
        let (mut rx, mut tx) = (VecDeque::new(), vec![]);
        let mut io = PeerIo {
            conns: Conns::new(c, &mut touched, &mut seen).with_ready(ready),
            udp_rx: &mut rx,
            udp_tx: &mut tx,
        };
        ab.poll(&mut io, now)
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

    /// Without keep-alive: ab connects (SYN), writes the request only once
    /// the SYN-ACK connected it, reads to the server's FIN, closes, and
    /// opens the next connection at the following poll, after its FIN
    /// left; the time runs from the connect.
    #[test]
    fn ab_without_keep_alive_opens_a_connection_per_request() {
        let names = ClientNames {
            prefix: "nginx",
            percentiles: "latency",
        };
        let shape = HttpShape {
            keep_alive: false,
            ..shape()
        };
        let mut ab = AbClient::new(shape, 1, US, names).connection_costs(4 * US, 2 * US);
        let cfg = TcpConfig {
            nagle: false,
            ..TcpConfig::default()
        };
        let mut c = [Tcp::new(cfg).unwrap()];
        let mut s = Tcp::listen(cfg).unwrap();
        let (cost, wake) = poll(&mut ab, &mut c, &[], 0);
        assert_eq!((cost, wake), (4 * US, None), "connect");
        assert_eq!(c[0].state(), TcpState::SynSent);
        assert_eq!(c[0].send_space(), c[0].config().sndbuf, "no request yet");
        // SYN, SYN-ACK: connected; the request goes with the final ACK.
        let syn = c[0].poll_output(5 * US).unwrap();
        s.on_segment(syn, 5 * US);
        let synack = s.poll_output(5 * US).unwrap();
        c[0].on_segment(synack, 10 * US);
        poll(&mut ab, &mut c, &[0], 10 * US);
        exchange(&mut c[0], &mut s, 10 * US);
        assert!(s.accept());
        assert_eq!(s.readable(), 100);
        // The server answers and closes; ab reads to the FIN and closes.
        let server = HttpShape {
            keep_alive: false,
            ..shape
        };
        let (n, cost) = serve_and_close(&mut s, &server, &costs());
        assert_eq!(n, 1);
        assert_eq!(cost, serve_cost() + 3 * US, "the close is charged");
        exchange(&mut c[0], &mut s, 40 * US);
        let (cost, wake) = poll(&mut ab, &mut c, &[0], 40 * US);
        assert_eq!(cost, US + 2 * US, "ab's request work and close()");
        assert_eq!(wake, Some(43 * US));
        assert_eq!(c[0].state(), TcpState::LastAck);
        exchange(&mut c[0], &mut s, 40 * US);
        assert_eq!(s.state(), TcpState::TimeWait);
        let mut m = Metrics::new();
        ab.metrics(&mut m);
        assert_eq!(m["nginx.completed"], 1.0);
        // From the connect's end (4 µs) to the close's end (43 µs).
        assert!((m["nginx.latency_p50_us"] - 39.0).abs() < 0.5, "{m:?}");
        // The next poll opens the next connection.
        let (cost, _) = poll(&mut ab, &mut c, &[], 43 * US);
        assert_eq!(cost, 4 * US);
        assert_eq!(c[0].state(), TcpState::SynSent);
        exchange(&mut c[0], &mut s, 50 * US);
        assert!(s.accept_pending());
        assert_eq!(s.connections_opened(), 2);
    }

    fn serve_cost() -> Time {
        300_000 + 8 * US + 100_000 * 950 / 1024
    }

    /// A keep-alive server never closes; without keep-alive it closes
    /// after the one request and serves nothing more on that connection.
    #[test]
    fn the_server_closes_only_without_keep_alive() {
        let (mut c, mut s) = pair();
        c.send(100);
        exchange(&mut c, &mut s, 0);
        let (_, cost) = serve_and_close(&mut s, &shape(), &costs());
        assert_eq!(cost, serve_cost());
        assert!(!s.is_closed_by_app());
        c.send(100);
        exchange(&mut c, &mut s, US);
        let once = HttpShape {
            keep_alive: false,
            ..shape()
        };
        serve_and_close(&mut s, &once, &costs());
        assert!(s.is_closed_by_app());
        exchange(&mut c, &mut s, 2 * US);
        assert_eq!(c.state(), TcpState::CloseWait);
        assert_eq!(c.readable(), 1700);
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
