//! netperf (ES2 §6.2, §6.3): TCP_STREAM and UDP_STREAM between the VM and
//! the client host, `msg_bytes` per send() (ES2: 512).
//!
//! * TCP_STREAM is iperf's machinery ([`super::iperf`]): the sender writes
//!   `msg_bytes` per send() as fast as its socket buffer allows, the
//!   receiver (netserver) reads what arrived, up to [`RECV_BYTES`] per
//!   recv(); metrics under `netperf.`.
//! * UDP_STREAM: the sender calls sendto() with `msg_bytes` in a loop. In
//!   the guest, a full send buffer blocks it (`sock_wait_for_wmem`) until
//!   the transmit path drains half of it; on the client host the sender
//!   runs as fast as its CPU allows and, when its NIC queue holds
//!   [`PEER_TXQUEUE_FRAMES`] frames, waits for the link. The receiver
//!   counts what its socket delivers: netperf reports UDP throughput on
//!   the receive side, so datagrams dropped anywhere on the way (full
//!   rings, socket buffers, the tap queue) are not counted.
//!
//! Each instance (`threads`) is its own process with its own connection
//! or UDP flow on both hosts.

use super::iperf::{Meter, Name};
use super::peer::{PeerApp, PeerIo};
use crate::engine::Time;
use crate::guest::app::{App, Datagram, Metrics, Sys, TaskStep};

/// Bytes netserver (or netperf on the receive side) asks per recv(): its
/// default receive size is the socket's receive buffer at creation, Linux's
/// `tcp_rmem[1]` (87380 bytes).
pub const RECV_BYTES: u32 = 87_380;

/// Frames the client host's NIC queue holds before its UDP sender waits
/// for the link: Linux's default `txqueuelen` (1000).
pub const PEER_TXQUEUE_FRAMES: u64 = 1000;

/// Costs of a netperf system call.
#[derive(Clone, Copy, Debug)]
pub struct NetperfCosts {
    /// Entry and exit of one send()/recv().
    pub syscall: Time,
    /// sendto()'s system-call part above udp_sendmsg (entry and exit, the
    /// socket and address look-ups); udp_sendmsg and below are the
    /// kernel's transmit path.
    pub sendto: Time,
    /// Copying one KiB between user and kernel.
    pub copy_per_kib: Time,
}

impl NetperfCosts {
    pub(crate) fn call(&self, bytes: u32) -> Time {
        self.syscall + self.copy(bytes)
    }

    fn copy(&self, bytes: u32) -> Time {
        self.copy_per_kib * bytes as Time / 1024
    }
}

fn add(out: &mut Metrics, key: String, v: f64) {
    *out.entry(key).or_insert(0.0) += v;
}

/// What a UDP_STREAM receiver (netserver, in the guest or on the client
/// host) got: the throughput meter and the datagram count.
struct Received {
    meter: Meter,
    /// Datagrams the application received.
    count: u64,
    instance: Option<usize>,
}

impl Received {
    fn new(instance: Option<usize>) -> Self {
        Received {
            meter: Meter::default(),
            count: 0,
            instance,
        }
    }

    fn add(&mut self, len: u32, at: Time) {
        self.count += 1;
        self.meter.add(len, at);
    }

    fn reset(&mut self) {
        self.meter = Meter::default();
        self.count = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        let name = Name {
            prefix: "netperf",
            instance: self.instance,
        };
        self.meter.metrics(out, &name);
        add(out, "netperf.messages_received".into(), self.count as f64);
    }
}

/// UDP_STREAM's sender in the guest: sendto() of `msg` bytes on flow
/// `flow`, in a loop, blocking while the send buffer is full.
pub struct UdpStreamSend {
    flow: u16,
    msg: u32,
    costs: NetperfCosts,
    seq: u64,
    /// Datagrams sendto() took.
    pub sent: u64,
    blocked: u64,
}

impl UdpStreamSend {
    /// A sender of `msg`-byte datagrams on `flow`.
    pub fn new(flow: u16, msg: u32, costs: NetperfCosts) -> Self {
        UdpStreamSend {
            flow,
            msg,
            costs,
            seq: 0,
            sent: 0,
            blocked: 0,
        }
    }
}

impl App for UdpStreamSend {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let d = Datagram {
            flow: self.flow,
            len: self.msg,
            seq: self.seq,
            sent: sys.now,
        };
        if !sys.udp_send(d) {
            // The send buffer is full: sendto() sleeps until it drains.
            self.blocked += 1;
            return TaskStep::Block;
        }
        self.seq += 1;
        self.sent += 1;
        TaskStep::Compute(self.costs.sendto + self.costs.copy(self.msg))
    }

    fn reset_metrics(&mut self) {
        self.sent = 0;
        self.blocked = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        add(out, "netperf.messages_sent".into(), self.sent as f64);
        add(out, "netperf.send_blocked".into(), self.blocked as f64);
    }
}

/// UDP_STREAM's receiver in the guest (netserver): recv() in a loop on its
/// bound socket.
pub struct UdpStreamRecv {
    costs: NetperfCosts,
    received: Received,
}

impl UdpStreamRecv {
    /// A receiver; `instance` names its metrics when several run.
    pub fn new(costs: NetperfCosts, instance: Option<usize>) -> Self {
        UdpStreamRecv {
            costs,
            received: Received::new(instance),
        }
    }
}

impl App for UdpStreamRecv {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        match sys.recv() {
            Some(d) => {
                self.received.add(d.len, sys.now);
                TaskStep::Compute(self.costs.call(d.len))
            }
            None => TaskStep::Block,
        }
    }

    fn reset_metrics(&mut self) {
        self.received.reset();
    }

    fn metrics(&self, out: &mut Metrics) {
        self.received.metrics(out);
    }
}

/// UDP_STREAM's sender on the client host: one datagram of `msg` bytes
/// per run of the process (its sendto() path is the host stack's per
/// datagram cost), as fast as the CPU allows, pausing while its NIC queue
/// is full. `wire` is one frame's time on the link (0 through the bridge:
/// the tap queue, not the sender, limits).
pub struct UdpStreamSource {
    flow: u16,
    msg: u32,
    wire: Time,
    syscall: Time,
    /// When the sender's NIC has sent everything queued so far.
    nic_free: Time,
    seq: u64,
    /// Datagrams sent.
    pub sent: u64,
}

impl UdpStreamSource {
    /// A client-host sender on `flow`.
    pub fn new(flow: u16, msg: u32, wire: Time, syscall: Time) -> Self {
        UdpStreamSource {
            flow,
            msg,
            wire,
            syscall,
            nic_free: 0,
            seq: 0,
            sent: 0,
        }
    }
}

impl PeerApp for UdpStreamSource {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let backlog = self.wire * PEER_TXQUEUE_FRAMES;
        if self.wire > 0 && self.nic_free > now + backlog {
            // The queue is full: sendto() blocks until the NIC drains it.
            return (0, Some(self.nic_free - backlog));
        }
        io.udp_tx.push(Datagram {
            flow: self.flow,
            len: self.msg,
            seq: self.seq,
            sent: now,
        });
        self.seq += 1;
        self.sent += 1;
        self.nic_free = self.nic_free.max(now) + self.wire;
        // Again as soon as the CPU is free (the stack's transmit path runs
        // first).
        (self.syscall, Some(now + self.syscall))
    }

    fn reset_metrics(&mut self) {
        self.sent = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        add(out, "netperf.messages_sent".into(), self.sent as f64);
    }
}

/// UDP_STREAM's receiver on the client host (netserver): reads every
/// datagram its socket holds.
pub struct UdpStreamSink {
    syscall: Time,
    received: Received,
}

impl UdpStreamSink {
    /// A client-host receiver; `instance` names its metrics when several
    /// run.
    pub fn new(syscall: Time, instance: Option<usize>) -> Self {
        UdpStreamSink {
            syscall,
            received: Received::new(instance),
        }
    }
}

impl PeerApp for UdpStreamSink {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let mut cost = 0;
        while let Some(d) = io.udp_rx.pop_front() {
            cost += self.syscall;
            self.received.add(d.len, now + cost);
        }
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.received.reset();
    }

    fn metrics(&self, out: &mut Metrics) {
        self.received.metrics(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::US;
    use crate::guest::app::Conns;
    use crate::guest::tcp::Tcp;
    use std::collections::VecDeque;

    fn costs() -> NetperfCosts {
        NetperfCosts {
            syscall: 150_000,
            sendto: 150_000,
            copy_per_kib: 100_000,
        }
    }

    fn sys<'a>(
        now: Time,
        rx: &'a mut VecDeque<Datagram>,
        tx: &'a mut VecDeque<Datagram>,
    ) -> Sys<'a> {
        Sys {
            now,
            socket: Some(rx),
            tcp: None,
            conns: None,
            blk: None,
            udp_tx: Some(tx),
            shared: None,
            vsock: None,
        }
    }

    #[test]
    fn the_guest_sender_blocks_on_a_full_send_buffer_and_resends_the_same_datagram() {
        let mut s = UdpStreamSend::new(3, 512, costs());
        let (mut rx, mut tx) = (VecDeque::new(), VecDeque::new());
        let cap = crate::guest::app::UDP_SNDBUF_DATAGRAMS;
        for _ in 0..cap {
            let step = s.step(&mut sys(0, &mut rx, &mut tx));
            // 150 ns + half a KiB copied.
            assert_eq!(step, TaskStep::Compute(150_000 + 50_000));
        }
        assert_eq!(tx.len(), cap);
        assert_eq!(s.step(&mut sys(0, &mut rx, &mut tx)), TaskStep::Block);
        assert_eq!(s.sent as usize, cap);
        // Drained: the datagram it could not send goes next, same number.
        tx.clear();
        s.step(&mut sys(US, &mut rx, &mut tx));
        assert_eq!(tx[0].seq, cap as u64);
        assert_eq!((tx[0].flow, tx[0].len, tx[0].sent), (3, 512, US));
        let mut m = Metrics::new();
        s.metrics(&mut m);
        assert_eq!(m["netperf.messages_sent"], cap as f64 + 1.0);
        assert_eq!(m["netperf.send_blocked"], 1.0);
    }

    #[test]
    fn the_guest_receiver_counts_payload_over_its_receiving_time() {
        let mut r = UdpStreamRecv::new(costs(), Some(1));
        let (mut rx, mut tx) = (VecDeque::new(), VecDeque::new());
        // 1001 datagrams of 1000 bytes, one per µs: 8 Gb/s.
        for i in 0..=1000u64 {
            rx.push_back(Datagram {
                flow: 1,
                len: 1000,
                seq: i,
                sent: 0,
            });
            assert!(matches!(
                r.step(&mut sys(i * US, &mut rx, &mut tx)),
                TaskStep::Compute(_)
            ));
        }
        assert_eq!(
            r.step(&mut sys(2000 * US, &mut rx, &mut tx)),
            TaskStep::Block
        );
        let mut m = Metrics::new();
        r.metrics(&mut m);
        // 1001 × 8000 bits over the 1000 µs from first to last.
        assert!((m["netperf.throughput_gbps"] - 8.008).abs() < 1e-9, "{m:?}");
        assert_eq!(
            m["netperf.thread1.throughput_gbps"],
            m["netperf.throughput_gbps"]
        );
        assert_eq!(m["netperf.messages_received"], 1001.0);
    }

    fn peer_io<'a>(
        conns: &'a mut [Tcp],
        touched: &'a mut Vec<usize>,
        seen: &'a mut [bool],
        rx: &'a mut VecDeque<Datagram>,
        tx: &'a mut Vec<Datagram>,
    ) -> PeerIo<'a> {
        PeerIo {
            conns: Conns::new(conns, touched, seen),
            udp_rx: rx,
            udp_tx: tx,
        }
    }

    #[test]
    fn the_client_sender_waits_for_its_nic_queue_and_not_otherwise() {
        // A link 10x slower than the CPU: the NIC queue fills, then the
        // sender keeps pace with the link.
        let wire = 10 * US;
        let mut s = UdpStreamSource::new(1, 512, wire, US);
        let (mut touched, mut seen, mut rx, mut tx) = (vec![], vec![], VecDeque::new(), vec![]);
        let mut now = 0;
        let mut sends = vec![];
        for _ in 0..3000 {
            let n0 = tx.len();
            let (cost, wake) = s.poll(
                &mut peer_io(&mut [], &mut touched, &mut seen, &mut rx, &mut tx),
                now,
            );
            if tx.len() > n0 {
                sends.push(now);
            }
            now = wake.unwrap().max(now + cost);
        }
        // First the queue fills at CPU speed (1 µs apart) ...
        assert_eq!(sends[1] - sends[0], US);
        // ... then the sends follow the link: one per frame time.
        let n = sends.len();
        assert_eq!(sends[n - 1] - sends[n - 2], wire);
        // Never more than the queue ahead of the link.
        assert!(s.nic_free - now <= wire * (PEER_TXQUEUE_FRAMES + 1));
        // Through the bridge (wire 0) it never waits.
        let mut b = UdpStreamSource::new(1, 512, 0, US);
        let (_, wake) = b.poll(
            &mut peer_io(&mut [], &mut touched, &mut seen, &mut rx, &mut tx),
            5 * US,
        );
        assert_eq!(wake, Some(6 * US));
    }

    #[test]
    fn the_client_receiver_drains_its_socket() {
        let mut r = UdpStreamSink::new(US, None);
        let (mut touched, mut seen, mut tx) = (vec![], vec![], vec![]);
        let mut rx: VecDeque<Datagram> = (0..4)
            .map(|i| Datagram {
                flow: 1,
                len: 512,
                seq: i,
                sent: 0,
            })
            .collect();
        let (cost, wake) = r.poll(
            &mut peer_io(&mut [], &mut touched, &mut seen, &mut rx, &mut tx),
            0,
        );
        assert_eq!((cost, wake), (4 * US, None));
        assert!(rx.is_empty());
        let mut m = Metrics::new();
        r.metrics(&mut m);
        assert_eq!(m["netperf.messages_received"], 4.0);
        assert_eq!(m["netperf.bytes"], 2048.0);
        assert!(!m.contains_key("netperf.thread0.throughput_gbps"));
    }
}
