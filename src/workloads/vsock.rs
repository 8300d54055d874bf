//! netperf TCP_STREAM over an `AF_VSOCK` socket (docs/vcanal.md,
//! "virtio-vsock"): the VM sends `msg` bytes per `send()` to a listener
//! on the host (the relay, which copies the stream to the client host).
//!
//! The socket's transport is the guest kernel's virtio-vsock driver
//! ([`VsockDriver`]); the program calls it as its system calls do:
//! `connect()` queues the REQUEST and sleeps until the RESPONSE, `send()`
//! queues RW packets within the peer's credit and sleeps on the socket
//! while there is none (`vsock_stream_sendmsg` waits on `sk_sleep`). The
//! driver's completion work (`virtio_transport_rx_work` and `_tx_work`,
//! kworkers on the same vCPU in Linux) runs in the task's context before
//! each call, and the queue notifies it asks for are the task's
//! [`TaskStep::Notify`]s (an OUT to the device's notify port, which the
//! hypervisor's ioeventfd turns into the back end's kick).

use crate::engine::Time;
use crate::guest::app::{App, Metrics, Sys, TaskStep};
use crate::guest::vsock::{State, VsockDriver, VsockStack};
use crate::workloads::http::HttpShape;
use std::cell::RefCell;
use std::rc::Rc;

/// The device's notify ports as the driver writes them (queue 0 RX,
/// queue 1 TX, as virtio-net's two ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VsockPorts {
    /// RX queue notify.
    pub rx: u16,
    /// TX queue notify.
    pub tx: u16,
}

impl VsockPorts {
    /// A notification decided in an earlier step and not yet sent, TX's
    /// first (each is a step of its own: one I/O write, one exit).
    fn take_kick(&self, kick_tx: &mut bool, kick_rx: &mut bool) -> Option<TaskStep> {
        if std::mem::take(kick_tx) {
            return Some(TaskStep::Notify {
                port: self.tx,
                value: 1,
            });
        }
        if std::mem::take(kick_rx) {
            return Some(TaskStep::Notify {
                port: self.rx,
                value: 0,
            });
        }
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Connect,
    Connecting,
    Streaming,
    /// The connection was reset (nobody listens): the program ends.
    Failed,
}

/// netperf's TCP_STREAM sender on a vsock socket.
pub struct VsockNetperf {
    drv: VsockDriver,
    ports: VsockPorts,
    msg: u32,
    syscall: Time,
    phase: Phase,
    /// The REQUEST, queued at connect().
    request: Option<crate::hw::virtio_vsock::Hdr>,
    /// Bytes of the current send() still to queue (0: none in progress).
    left: u32,
    kick_rx: bool,
    kick_tx: bool,
    sends: u64,
    bytes: u64,
    sleeps: u64,
}

impl VsockNetperf {
    /// The program over driver `drv` (probed, with `request` its
    /// connection's REQUEST), sending `msg` bytes per call.
    pub fn new(
        drv: VsockDriver,
        request: crate::hw::virtio_vsock::Hdr,
        ports: VsockPorts,
        msg: u32,
        syscall: Time,
    ) -> Self {
        VsockNetperf {
            drv,
            ports,
            msg: msg.max(1),
            syscall,
            phase: Phase::Connect,
            request: Some(request),
            left: 0,
            kick_rx: false,
            kick_tx: false,
            sends: 0,
            bytes: 0,
            sleeps: 0,
        }
    }

    /// The driver (its connection and counters).
    pub fn driver(&self) -> &VsockDriver {
        &self.drv
    }
}

impl App for VsockNetperf {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        // Notifications decided in the last step go out first.
        if let Some(kick) = self.ports.take_kick(&mut self.kick_tx, &mut self.kick_rx) {
            return kick;
        }
        let Some(dev) = sys.vsock.as_deref_mut() else {
            return TaskStep::Exit;
        };
        let (mut cost, rx_kick, tx_kick) = self.drv.completion_work(dev);
        self.kick_rx |= rx_kick;
        self.kick_tx |= tx_kick;
        match self.phase {
            Phase::Connect => {
                cost += self.syscall + self.drv.costs.tx_pkt;
                if let Some(req) = self.request.take() {
                    self.kick_tx |= self.drv.queue_control(dev, req);
                }
                self.phase = Phase::Connecting;
                TaskStep::Compute(cost)
            }
            Phase::Connecting | Phase::Streaming if self.drv.conn.state == State::Closed => {
                self.phase = Phase::Failed;
                TaskStep::Exit
            }
            Phase::Connecting => {
                if self.drv.conn.state == State::Established {
                    self.phase = Phase::Streaming;
                    return TaskStep::Compute(cost.max(1));
                }
                self.wait(cost)
            }
            Phase::Streaming => {
                if self.left == 0 {
                    // A new send() call.
                    self.left = self.msg;
                    cost += self.syscall;
                }
                let p = self.drv.send(dev, self.left);
                self.left -= p.bytes;
                self.bytes += u64::from(p.bytes);
                self.kick_tx |= p.kick;
                cost += p.cost;
                if self.left == 0 {
                    self.sends += 1;
                }
                if p.blocked && self.left > 0 && !self.kick_tx && !self.kick_rx && cost == 0 {
                    // Nothing done and no credit: sleep on the socket.
                    self.sleeps += 1;
                    return TaskStep::WaitDriver;
                }
                TaskStep::Compute(cost.max(1))
            }
            Phase::Failed => TaskStep::Exit,
        }
    }

    fn reset_metrics(&mut self) {
        self.sends = 0;
        self.bytes = 0;
        self.sleeps = 0;
        self.drv.counters = Default::default();
    }

    fn metrics(&self, out: &mut Metrics) {
        let c = &self.drv.counters;
        out.insert("vsock.guest_sends".into(), self.sends as f64);
        out.insert("vsock.guest_bytes".into(), self.bytes as f64);
        out.insert("vsock.guest_sleeps".into(), self.sleeps as f64);
        out.insert("vsock.guest_kicks_tx".into(), c.tx.kicks_tx as f64);
        out.insert("vsock.guest_kicks_rx".into(), c.kicks_rx as f64);
        out.insert(
            "vsock.guest_credit_stalls".into(),
            c.tx.credit_stalls as f64,
        );
        out.insert("vsock.guest_rx_buffers".into(), c.rx_bufs as f64);
    }
}

impl VsockNetperf {
    /// Sleep on the socket unless there is CPU time to charge first (the
    /// next step looks again).
    fn wait(&mut self, cost: Time) -> TaskStep {
        if cost > 0 || self.kick_tx || self.kick_rx {
            return TaskStep::Compute(cost.max(1));
        }
        self.sleeps += 1;
        TaskStep::WaitDriver
    }
}

/// The costs of the HTTP server's threads over `AF_VSOCK` sockets.
#[derive(Clone, Copy, Debug)]
pub struct VsockHttpCosts {
    /// One system call's entry and exit.
    pub syscall: Time,
    /// The server's own work per request (parse, lookup, header build,
    /// logging): `guest.nginx_request_ns`, as the kernel-socket server's.
    pub request: Time,
    /// The server's own work per connection (`guest.http_connection_ns`).
    pub connection: Time,
}

/// A connection a server thread has accepted: the bytes of its response
/// still to send (0 until its request is read).
#[derive(Clone, Copy, Debug)]
struct Served {
    sock: usize,
    left: u32,
    answered: bool,
}

/// One thread of an nginx-shaped HTTP server (docs/vcanal.md,
/// "ApacheBench over virtio-vsock") whose listening socket is `AF_VSOCK`
/// on its own port: an epoll loop that accepts the relay's connections,
/// reads each one's request, sends the response and closes it (HTTP/1.0
/// without keep-alive: the server closes first). The threads of the
/// server share the kernel's vsock socket table and driver
/// ([`VsockStack`]); the driver's completion work runs in whichever
/// thread runs next (in Linux a kworker on the same vCPU), and the
/// device's interrupt wakes every thread sleeping on it, each of which
/// looks at its own sockets.
pub struct VsockHttpThread {
    stack: Rc<RefCell<VsockStack>>,
    worker: usize,
    port: u32,
    ports: VsockPorts,
    shape: HttpShape,
    costs: VsockHttpCosts,
    conns: Vec<Served>,
    kick_rx: bool,
    kick_tx: bool,
    served: u64,
    closed: u64,
    sleeps: u64,
}

impl VsockHttpThread {
    /// Server thread `worker` listening on `port` of the shared `stack`.
    pub fn new(
        stack: Rc<RefCell<VsockStack>>,
        worker: usize,
        port: u32,
        ports: VsockPorts,
        shape: HttpShape,
        costs: VsockHttpCosts,
        max_conns: usize,
    ) -> Self {
        VsockHttpThread {
            stack,
            worker,
            port,
            ports,
            shape,
            costs,
            conns: Vec::with_capacity(max_conns),
            kick_rx: false,
            kick_tx: false,
            served: 0,
            closed: 0,
            sleeps: 0,
        }
    }

    /// Whether the epoll set has an event: a connection to accept, a whole
    /// request, room to send a response's rest, or a peer's reset.
    fn ready(&self, st: &VsockStack) -> bool {
        if st.accept_pending(self.port) {
            return true;
        }
        self.conns.iter().any(|c| {
            let Some(s) = st.sock(c.sock) else {
                return true;
            };
            s.conn.state == State::Closed
                || (c.left > 0 && s.conn.credit.space() > 0)
                || (!c.answered && s.conn.credit.rx_bytes >= self.shape.request)
        })
    }
}

impl App for VsockHttpThread {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        // Notifications decided in the last step go out first.
        if let Some(kick) = self.ports.take_kick(&mut self.kick_tx, &mut self.kick_rx) {
            return kick;
        }
        let Some(dev) = sys.vsock.as_deref_mut() else {
            return TaskStep::Exit;
        };
        let stack = self.stack.clone();
        let mut st = stack.borrow_mut();
        let (mut cost, rx_kick, tx_kick) = st.completion_work(dev);
        self.kick_rx |= rx_kick;
        self.kick_tx |= tx_kick;
        if !self.ready(&st) {
            if cost > 0 || self.kick_tx || self.kick_rx {
                return TaskStep::Compute(cost.max(1));
            }
            // epoll_wait sleeps until the device's interrupt.
            self.sleeps += 1;
            return TaskStep::WaitDriver;
        }
        let c = self.costs;
        // epoll_wait returns the ready sockets.
        cost += c.syscall;
        // accept4 and epoll_ctl(ADD) of each new connection.
        while self.conns.len() < self.conns.capacity() {
            let Some(i) = st.accept(self.port) else {
                break;
            };
            cost += 2 * c.syscall + c.connection;
            self.conns.push(Served {
                sock: i,
                left: 0,
                answered: false,
            });
        }
        let mut k = 0;
        while k < self.conns.len() {
            let mut conn = self.conns[k];
            let (state, queued) = match st.sock(conn.sock) {
                Some(s) => (s.conn.state, s.conn.credit.rx_bytes),
                None => (State::Closed, 0),
            };
            let mut done = state == State::Closed;
            if !done && !conn.answered && queued >= self.shape.request {
                // recv() of the request, the server's work, and the send()
                // of its response (header and page in one writev).
                let (_, t, kick) = st.recv(dev, conn.sock, self.shape.request);
                self.kick_tx |= kick;
                cost += c.syscall + t + c.request + c.syscall;
                conn.answered = true;
                conn.left = self.shape.response;
            }
            if !done && conn.left > 0 {
                let p = st.send(dev, conn.sock, conn.left);
                conn.left -= p.bytes;
                cost += p.cost;
                self.kick_tx |= p.kick;
                if conn.left == 0 {
                    self.served += 1;
                    done = true;
                }
            }
            if done {
                // close(): its SHUTDOWN (or RST after a peer's reset).
                let (t, kick) = st.close(dev, conn.sock);
                self.kick_tx |= kick;
                cost += c.syscall + t;
                self.closed += 1;
                self.conns.swap_remove(k);
                continue;
            }
            self.conns[k] = conn;
            k += 1;
        }
        TaskStep::Compute(cost.max(1))
    }

    fn reset_metrics(&mut self) {
        self.served = 0;
        self.closed = 0;
        self.sleeps = 0;
        if self.worker == 0 {
            self.stack.borrow_mut().counters = Default::default();
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert(
            format!("nginx.served.worker{}", self.worker),
            self.served as f64,
        );
        *out.entry("vsock.guest_closed".into()).or_insert(0.0) += self.closed as f64;
        *out.entry("vsock.guest_sleeps".into()).or_insert(0.0) += self.sleeps as f64;
        if self.worker == 0 {
            let st = self.stack.borrow();
            let k = &st.counters;
            out.insert("vsock.guest_requests".into(), k.requests as f64);
            out.insert("vsock.guest_accepted".into(), k.accepted as f64);
            out.insert("vsock.guest_removed".into(), k.removed as f64);
            out.insert("vsock.guest_refused".into(), k.refused as f64);
            out.insert("vsock.guest_dropped".into(), k.dropped as f64);
            out.insert("vsock.guest_kicks_tx".into(), k.tx.kicks_tx as f64);
            out.insert("vsock.guest_kicks_rx".into(), k.kicks_rx as f64);
            out.insert("vsock.guest_rx_buffers".into(), k.rx_bufs as f64);
            out.insert(
                "vsock.guest_credit_stalls".into(),
                k.tx.credit_stalls as f64,
            );
            out.insert("vsock.guest_socks_open".into(), st.open() as f64);
        }
    }
}
