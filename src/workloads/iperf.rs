//! iperf TCP stream (DID §5.5, §5.9): one side writes as fast as its send
//! buffer allows, the other reads everything; throughput is what the
//! receiving application got. Either end may be the guest: `to-vm` makes
//! the peer host the sender (the VM takes the receive interrupts),
//! `from-vm` the reverse.

use super::peer::{PeerApp, PeerIo};
use crate::engine::{Time, SEC};
use crate::guest::app::{App, Metrics, Sys, TaskStep};

/// Costs of iperf's system calls.
#[derive(Clone, Copy, Debug)]
pub struct IperfCosts {
    /// Entry and exit of one read()/write().
    pub syscall: Time,
    /// Copying one KiB between user and kernel.
    pub copy_per_kib: Time,
}

impl IperfCosts {
    fn call(&self, bytes: u32) -> Time {
        self.syscall + self.copy_per_kib * bytes as Time / 1024
    }
}

/// Throughput bookkeeping of the receiving side.
#[derive(Clone, Copy, Debug, Default)]
struct Meter {
    bytes: u64,
    since: Option<Time>,
    last: Time,
}

impl Meter {
    fn add(&mut self, bytes: u32, now: Time) {
        self.since.get_or_insert(now);
        self.bytes += bytes as u64;
        self.last = now;
    }

    fn gbps(&self) -> f64 {
        match self.since {
            Some(t0) if self.last > t0 => {
                self.bytes as f64 * 8.0 / ((self.last - t0) as f64 / SEC as f64) / 1e9
            }
            _ => 0.0,
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("iperf.throughput_gbps".into(), self.gbps());
        out.insert("iperf.bytes".into(), self.bytes as f64);
    }
}

/// The guest's iperf: sender or receiver, `len`-byte read/write calls.
pub struct IperfGuest {
    send: bool,
    len: u32,
    costs: IperfCosts,
    meter: Meter,
}

impl IperfGuest {
    /// A guest-side iperf; `send` = it is the client (`from-vm`).
    pub fn new(send: bool, len: u32, costs: IperfCosts) -> Self {
        IperfGuest {
            send,
            len,
            costs,
            meter: Meter::default(),
        }
    }
}

impl App for IperfGuest {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let n = if self.send {
            sys.tcp_send(self.len)
        } else {
            let n = sys.tcp_recv(self.len);
            if n > 0 {
                self.meter.add(n, sys.now);
            }
            n
        };
        if n == 0 {
            return TaskStep::Block;
        }
        TaskStep::Compute(self.costs.call(n))
    }

    fn reset_metrics(&mut self) {
        self.meter = Meter::default();
    }

    fn metrics(&self, out: &mut Metrics) {
        if !self.send {
            self.meter.metrics(out);
        }
    }
}

/// The peer's iperf: the other end of [`IperfGuest`].
pub struct IperfPeer {
    send: bool,
    len: u32,
    costs: IperfCosts,
    meter: Meter,
}

impl IperfPeer {
    /// A peer-side iperf; `send` = it is the client (`to-vm`).
    pub fn new(send: bool, len: u32, costs: IperfCosts) -> Self {
        IperfPeer {
            send,
            len,
            costs,
            meter: Meter::default(),
        }
    }
}

impl PeerApp for IperfPeer {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        if conns.is_empty() {
            return (0, None);
        }
        let tcp = conns.get(0);
        let mut cost = 0;
        loop {
            let n = if self.send {
                tcp.send(self.len)
            } else {
                tcp.recv(self.len)
            };
            if n == 0 {
                return (cost, None);
            }
            cost += self.costs.call(n);
            if !self.send {
                self.meter.add(n, now + cost);
            }
        }
    }

    fn reset_metrics(&mut self) {
        self.meter = Meter::default();
    }

    fn metrics(&self, out: &mut Metrics) {
        if !self.send {
            self.meter.metrics(out);
        }
    }
}
