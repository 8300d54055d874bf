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
pub(crate) struct Meter {
    bytes: u64,
    since: Option<Time>,
    last: Time,
}

impl Meter {
    pub(crate) fn add(&mut self, bytes: u32, now: Time) {
        self.since.get_or_insert(now);
        self.bytes += bytes as u64;
        self.last = now;
    }

    pub(crate) fn gbps(&self) -> f64 {
        match self.since {
            Some(t0) if self.last > t0 => {
                self.bytes as f64 * 8.0 / ((self.last - t0) as f64 / SEC as f64) / 1e9
            }
            _ => 0.0,
        }
    }

    /// Adds `<name>.throughput_gbps` and `<name>.bytes` to what `out`
    /// holds (several instances report their sum), and with an instance
    /// number also `<name>.thread<i>.` ones.
    pub(crate) fn metrics(&self, out: &mut Metrics, name: &Name) {
        *out.entry(format!("{}.throughput_gbps", name.prefix))
            .or_insert(0.0) += self.gbps();
        *out.entry(format!("{}.bytes", name.prefix)).or_insert(0.0) += self.bytes as f64;
        if let Some(i) = name.instance {
            out.insert(
                format!("{}.thread{i}.throughput_gbps", name.prefix),
                self.gbps(),
            );
        }
    }
}

/// How a stream program names its metrics: `iperf` or `netperf`, and its
/// instance number when several run.
#[derive(Clone, Copy, Debug)]
pub struct Name {
    /// The metric prefix.
    pub prefix: &'static str,
    /// The instance, when there are several.
    pub instance: Option<usize>,
}

impl Name {
    const IPERF: Name = Name {
        prefix: "iperf",
        instance: None,
    };
}

/// The guest's iperf: sender or receiver, `len`-byte read/write calls.
pub struct IperfGuest {
    send: bool,
    len: u32,
    costs: IperfCosts,
    meter: Meter,
    name: Name,
    calls: u64,
}

impl IperfGuest {
    /// A guest-side iperf; `send` = it is the client (`from-vm`).
    pub fn new(send: bool, len: u32, costs: IperfCosts) -> Self {
        IperfGuest {
            send,
            len,
            costs,
            meter: Meter::default(),
            name: Name::IPERF,
            calls: 0,
        }
    }

    /// The same program reporting under `name` (netperf's TCP_STREAM);
    /// a sender also reports its send() calls (`<prefix>.messages_sent`).
    pub fn named(mut self, name: Name) -> Self {
        self.name = name;
        self
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
        self.calls += 1;
        TaskStep::Compute(self.costs.call(n))
    }

    fn reset_metrics(&mut self) {
        self.meter = Meter::default();
        self.calls = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        if !self.send {
            self.meter.metrics(out, &self.name);
        } else if self.name.prefix != "iperf" {
            *out.entry(format!("{}.messages_sent", self.name.prefix))
                .or_insert(0.0) += self.calls as f64;
        }
    }
}

/// The peer's iperf: the other end of [`IperfGuest`], one process per
/// connection (each connection's calls are its own).
pub struct IperfPeer {
    send: bool,
    len: u32,
    costs: IperfCosts,
    meters: Vec<Meter>,
    calls: u64,
    prefix: &'static str,
}

impl IperfPeer {
    /// A peer-side iperf; `send` = it is the client (`to-vm`).
    pub fn new(send: bool, len: u32, costs: IperfCosts) -> Self {
        IperfPeer {
            send,
            len,
            costs,
            meters: vec![Meter::default()],
            calls: 0,
            prefix: "iperf",
        }
    }

    /// The same program over `conns` connections, reporting as `prefix`
    /// (netperf's TCP_STREAM instances on the client host).
    pub fn instances(mut self, conns: usize, prefix: &'static str) -> Self {
        self.meters = vec![Meter::default(); conns.max(1)];
        self.prefix = prefix;
        self
    }
}

impl PeerApp for IperfPeer {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let conns = &mut io.conns;
        let mut cost = 0;
        for i in 0..conns.len().min(self.meters.len()) {
            let tcp = conns.get(i);
            loop {
                let n = if self.send {
                    tcp.send(self.len)
                } else {
                    tcp.recv(self.len)
                };
                if n == 0 {
                    break;
                }
                self.calls += 1;
                cost += self.costs.call(n);
                if !self.send {
                    self.meters[i].add(n, now + cost);
                }
            }
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.meters.iter_mut().for_each(|m| *m = Meter::default());
        self.calls = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        let several = self.meters.len() > 1;
        if !self.send {
            for (i, m) in self.meters.iter().enumerate() {
                let name = Name {
                    prefix: self.prefix,
                    instance: several.then_some(i),
                };
                m.metrics(out, &name);
            }
        } else if self.prefix != "iperf" {
            out.insert(format!("{}.messages_sent", self.prefix), self.calls as f64);
        }
    }
}
