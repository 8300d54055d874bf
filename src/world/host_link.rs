//! The wire between the host's own NIC and the client host, as the host
//! stacks of the vCanal service (`world::vcanal`) and of the vsock relay
//! (`world::vsock`) drive it: a FIFO of frames in flight each way, each
//! frame's time on the wire (a GSO packet as its train of MSS frames)
//! plus propagation, and the arrivals not yet put on the event queue.

use crate::calibration::Calibration;
use crate::engine::{from_ns, from_us, Time};
use crate::hw::wire::Frame;
use crate::hw::x86::nic::Link;
use std::collections::VecDeque;

/// Frames in flight both ways; `T` tags each with what its receiver needs
/// (the vCanal VM a frame belongs to; nothing for the one vsock stream).
pub(super) struct HostLink<T> {
    link: Link,
    to_peer: VecDeque<(Time, T, Frame)>,
    to_host: VecDeque<(Time, T, Frame)>,
    /// When each direction's wire is free again.
    wire_out: Time,
    wire_in: Time,
    /// Frames at the back of `to_peer` / `to_host` whose arrival is not
    /// yet scheduled.
    unsched_peer: usize,
    unsched_host: usize,
}

/// Which way a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Towards {
    /// From the host's NIC to the client host.
    Peer,
    /// From the client host to the host's NIC.
    Host,
}

impl<T: Copy> HostLink<T> {
    pub(super) fn new(link: Link) -> Self {
        HostLink {
            link,
            to_peer: VecDeque::with_capacity(1024),
            to_host: VecDeque::with_capacity(1024),
            wire_out: 0,
            wire_in: 0,
            unsched_peer: 0,
            unsched_host: 0,
        }
    }

    /// Wire time of a frame (a GSO packet: its train of MSS frames).
    fn wire_time(&self, f: &Frame) -> Time {
        let n = f.gso_segs();
        if n > 1 {
            (0..n)
                .map(|k| self.link.wire_time(f.gso_segment(k).len()))
                .sum()
        } else {
            self.link.wire_time(f.len())
        }
    }

    /// `f` leaves at `leave` towards `dir`, behind what is already on that
    /// direction's wire (the link is a FIFO).
    pub(super) fn send(&mut self, dir: Towards, tag: T, f: Frame, leave: Time) {
        let wt = self.wire_time(&f);
        let (wire, queue, unsched) = match dir {
            Towards::Peer => (
                &mut self.wire_out,
                &mut self.to_peer,
                &mut self.unsched_peer,
            ),
            Towards::Host => (&mut self.wire_in, &mut self.to_host, &mut self.unsched_host),
        };
        *wire = leave.max(*wire) + wt;
        queue.push_back((*wire + self.link.propagation_ps, tag, f));
        *unsched += 1;
    }

    /// Hands each arrival not yet scheduled to `schedule`, towards the
    /// peer first, each direction in order.
    pub(super) fn schedule_arrivals(&mut self, mut schedule: impl FnMut(Time, Towards)) {
        for (dir, queue, unsched) in [
            (Towards::Peer, &self.to_peer, &mut self.unsched_peer),
            (Towards::Host, &self.to_host, &mut self.unsched_host),
        ] {
            let n = queue.len();
            for (arrive, _, _) in queue.range(n - (*unsched).min(n)..) {
                schedule(*arrive, dir);
            }
            *unsched = 0;
        }
    }

    /// The frame at the head of `dir`'s wire, which arrives now.
    pub(super) fn arrive(&mut self, dir: Towards) -> Option<(T, Frame)> {
        let queue = match dir {
            Towards::Peer => &mut self.to_peer,
            Towards::Host => &mut self.to_host,
        };
        queue.pop_front().map(|(_, tag, f)| (tag, f))
    }
}

/// Costs of the host's own stack, under the vCanal service and under the
/// vsock relay: the host runs the same Linux as the guests on the same
/// class of NIC, so the guest's per-call and per-segment costs, built from
/// the same calibration entries in one place.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostStack {
    pub(super) syscall: Time,
    pub(super) copy_per_kib: Time,
    pub(super) tcp_tx_segment: Time,
    pub(super) tcp_rx_segment: Time,
    pub(super) udp_tx: Time,
    pub(super) rx_per_packet: Time,
    pub(super) xmit: Time,
    pub(super) napi_poll: Time,
    pub(super) nic_irq: Time,
    pub(super) accept: Time,
    pub(super) epoll_event: Time,
    /// A SYN on a passive socket, the final ACK, and close() past the
    /// system call (the host runs Linux as the guests do).
    pub(super) conn_request: Time,
    pub(super) syn_recv_sock: Time,
    pub(super) close: Time,
}

impl HostStack {
    pub(super) fn new(cal: &Calibration) -> Self {
        let g = &cal.guest;
        let ns = |e: &crate::calibration::Entry| from_ns(e.value);
        HostStack {
            syscall: ns(&g.syscall_ns),
            copy_per_kib: ns(&g.copy_per_kib_ns),
            tcp_tx_segment: ns(&g.tcp_tx_segment_ns),
            tcp_rx_segment: ns(&g.tcp_rx_segment_ns),
            udp_tx: ns(&g.udp_tx_datagram_ns),
            rx_per_packet: ns(&g.rx_per_packet_ns),
            xmit: ns(&g.vf_xmit_ns),
            napi_poll: ns(&g.napi_poll_base_ns),
            nic_irq: from_us(cal.host.irq_handler_us.value),
            accept: ns(&cal.vcanal.host_accept_ns),
            epoll_event: ns(&cal.vcanal.host_epoll_event_ns),
            conn_request: ns(&g.tcp_conn_request_ns),
            syn_recv_sock: ns(&g.tcp_syn_recv_sock_ns),
            close: ns(&g.tcp_close_ns),
        }
    }

    /// Copying `bytes` between a socket and user memory.
    pub(super) fn copy(&self, bytes: u64) -> Time {
        self.copy_per_kib * bytes / 1024
    }
}
