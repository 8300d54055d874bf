//! The wire between the host's own NIC and the client host, as the host
//! stacks of the vCanal service (`world::vcanal`) and of the vsock relay
//! (`world::vsock`) drive it: a FIFO of frames in flight each way, each
//! frame's time on the wire (a GSO packet as its train of MSS frames)
//! plus propagation, and the arrivals not yet put on the event queue.

use crate::engine::Time;
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
