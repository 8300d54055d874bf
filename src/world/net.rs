//! The network paths on the platform.
//!
//! * **PV**: the vhost-net worker on its host core, the bridge between its
//!   tap device and a peer process on the host, and the irqfd that turns
//!   the worker's signal into the scheme's virtual interrupt.
//! * **SR-IOV**: the VF's transmit queue puts frames on the 10 GbE link to
//!   the load generator, whose frames come back into the VF's RX ring, or
//!   through the NIC's embedded switch to a process on the host (the PF).
//!
//! A guest may talk to several peers (a SIP B2BUA talks to a client and a
//! server); a frame goes to the peer that owns its flow. Frames cross the
//! bridge, the switch and the link in order with a fixed delay, so each
//! direction of each peer is a FIFO and events carry no frames.

use super::event::Ev;
use super::World;
use crate::engine::Time;
use crate::hv::vhost::{VhostCosts, VhostNet};
use crate::hw::wire::Frame;
use crate::hw::x86::nic::RxPacket;
use crate::workloads::peer::PeerHost;
use std::collections::VecDeque;

/// The vhost side of a virtio-net device.
pub(super) struct PvPath {
    pub(super) vhost: VhostNet,
    pub(super) costs: VhostCosts,
    /// The guest's MSI-X vector for each queue (RX, TX): the irqfd routes.
    pub(super) vectors: [u8; 2],
}

/// Where a peer host is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attach {
    /// A process on the VM's host, behind the bridge and the tap device.
    Bridge {
        /// Bridge forwarding delay.
        delay: Time,
    },
    /// The load generator at the other end of the link, reached through
    /// the host's own NIC and the bridge (a PV guest's external traffic).
    Uplink {
        /// Bridge forwarding delay.
        delay: Time,
    },
    /// The load generator at the other end of the link, to VF `vf`.
    Wire {
        /// The VF.
        vf: u16,
    },
    /// A process on the VM's host, reached from VF `vf` through the NIC's
    /// embedded switch and the PF (no link crossing).
    Veb {
        /// The VF.
        vf: u16,
        /// Switch loopback delay.
        delay: Time,
    },
}

/// A peer host and the frames in flight to and from it. Each direction is
/// a FIFO: frames cross the bridge, the switch and the link in order.
pub(super) struct PeerLink {
    pub(super) peer: PeerHost,
    pub(super) attach: Attach,
    /// The VM it talks to (its metrics are that VM's).
    pub(super) vm: usize,
    to_peer: VecDeque<Frame>,
    to_guest: VecDeque<Frame>,
    out: Vec<(Time, Frame)>,
    /// The peer's next deadline, as last seen.
    timer: Option<Time>,
    /// When the peer must run for it and the tie-break key reserved when
    /// the deadline was set: its place in the event order.
    due: Option<(Time, u64)>,
    /// The `PeerTimer` events queued, by time and key, latest first.
    /// Timers are re-armed lazily: a deadline that moves later leaves the
    /// queued events in place, and the earliest, when it comes, re-arms for
    /// the deadline then current (with the key reserved for it) unless a
    /// later queued one still comes first; only a deadline earlier than
    /// every queued event queues one at once. Each is earlier than those
    /// queued before it, so they come last in, first out. A TCP sender's
    /// retransmission deadline moves with every ACK: eager re-arming queued
    /// an event per ACK, tens of thousands of them pending in a stream.
    armed: Vec<(Time, u64)>,
    /// When the last frame towards the guest is delivered (frames keep
    /// their order) or, over the link, when the peer's NIC is free.
    wire_free: Time,
    /// When the last frame towards the peer is delivered.
    to_peer_last: Time,
}

impl PeerLink {
    pub(super) fn new(peer: PeerHost, attach: Attach) -> Self {
        PeerLink {
            peer,
            attach,
            vm: 0,
            to_peer: VecDeque::with_capacity(1024),
            to_guest: VecDeque::with_capacity(1024),
            out: Vec::with_capacity(1024),
            timer: None,
            due: None,
            armed: Vec::with_capacity(8),
            wire_free: 0,
            to_peer_last: 0,
        }
    }
}

impl World {
    /// An eventfd was signalled: a guest kick of one of vhost's queues.
    pub(super) fn pv_eventfd(&mut self, fd: u16) {
        let Some(pv) = &mut self.pv else { return };
        if pv.vhost.kick(fd) == Some(true) {
            let w = pv.costs.start_latency(pv.vhost.polling);
            self.q.schedule_in(w, Ev::VhostStep { dev: 0 });
        }
    }

    /// The vhost worker finished a unit of work (or just woke up).
    pub(super) fn pv_vhost_step(&mut self) {
        let now = self.q.now();
        let Some(pv) = &mut self.pv else { return };
        let vq = &mut self.m.virtio_net[pv.vhost.dev];
        let done = pv.vhost.complete(vq, &pv.costs);
        // None: asleep until the next kick or tap frame wakes it.
        if let Some(cost) = pv.vhost.begin(vq, &pv.costs) {
            self.q
                .schedule(now + done.extra + cost, Ev::VhostStep { dev: 0 });
        }
        let (vm, vectors) = (pv.vhost.vm, pv.vectors);
        if let Some(f) = done.to_bridge {
            self.frame_to_peer(f, None, now);
        }
        if let Some(queue) = done.signal {
            self.irqfd(vm, vectors[queue]);
        }
    }

    /// The polling worker (ELVIS) looks at the rings the guest may just
    /// have published to.
    pub(super) fn pv_poll_observe(&mut self) {
        let Some(pv) = &mut self.pv else { return };
        if !pv.vhost.polling {
            return;
        }
        let vq = &self.m.virtio_net[pv.vhost.dev];
        if pv.vhost.poll_rings(vq) {
            let w = pv.costs.poll_iteration;
            self.q.schedule_in(w, Ev::VhostStep { dev: 0 });
        }
    }

    /// irqfd: the back end's signal becomes the scheme's virtual interrupt
    /// (`kvm_set_irq` → the VM's LAPIC as the scheme keeps it).
    fn irqfd(&mut self, vm: usize, vector: u8) {
        let now = self.q.now();
        self.checker.raised(vm, vector, now);
        let vcpu = self.hv.vms[vm].vcpus[0];
        let (mut cx, scheme) = self.cx();
        scheme.virtual_interrupt(&mut cx, vcpu, vector);
    }

    /// The VF's head TX frame left the wire: write-back, and the frame
    /// travels to the load generator.
    pub(super) fn vf_tx_done(&mut self, vf: u16) {
        let now = self.q.now();
        let Ok((f, irq, next)) = self.m.nic.tx_complete(vf, now) else {
            return;
        };
        if let Some(t) = next {
            self.q.schedule(t, Ev::VfTxDone { vf });
        }
        self.nic_action(irq);
        if let Some(f) = f {
            self.frame_to_peer(f, Some(vf), now);
        }
    }

    /// A frame the guest sent left its device (the tap, or VF `from`'s TX
    /// queue) at `now`: it travels to the peer that owns its flow (among
    /// those attached to that VF: each VM numbers its flows from 1).
    fn frame_to_peer(&mut self, f: Frame, from: Option<u16>, now: Time) {
        let Some(p) = self.peers.iter().position(|l| {
            l.peer.owns(f.flow)
                && match (l.attach, from) {
                    (Attach::Wire { vf } | Attach::Veb { vf, .. }, Some(v)) => vf == v,
                    (Attach::Bridge { .. } | Attach::Uplink { .. }, Some(_)) => false,
                    (_, None) => true,
                }
        }) else {
            return;
        };
        let link = &mut self.peers[p];
        let at = match link.attach {
            Attach::Bridge { delay } | Attach::Veb { delay, .. } => now + delay,
            // The host's NIC sends the bridged frame on the link.
            Attach::Uplink { delay } => {
                now + delay + self.m.link.wire_time(f.len()) + self.m.link.propagation_ps
            }
            Attach::Wire { .. } => now + self.m.link.propagation_ps,
        };
        let at = at.max(link.to_peer_last);
        link.to_peer_last = at;
        link.to_peer.push_back(f);
        self.q.schedule(at, Ev::ToPeer { peer: p as u8 });
    }

    /// A frame from the guest reached peer `p`.
    pub(super) fn peer_receive(&mut self, p: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let Some(f) = link.to_peer.pop_front() else {
            return;
        };
        link.out.clear();
        link.peer.receive(f, now, &mut link.out);
        self.peer_sent(p);
    }

    /// A timer event of peer `p`, queued with tie-break key `key`, came.
    pub(super) fn peer_timer(&mut self, p: usize, key: u64) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        // The earliest queued is the first to come.
        let fired = link.armed.pop();
        debug_assert_eq!(fired.map(|a| a.1), Some(key));
        match link.due {
            Some((_, k)) if k == key => {}
            // The deadline moved later since this was queued (in the
            // queue's order of (time, key): `due` is not earlier): wait for
            // it in the place reserved for it.
            Some(due) => {
                if link.armed.last().is_none_or(|&a| due < a) {
                    link.armed.push(due);
                    let peer = p as u8;
                    self.q
                        .schedule_reserved(due.0, due.1, Ev::PeerTimer { peer, key: due.1 });
                }
                return;
            }
            // No deadline any more.
            None => return,
        }
        link.timer = None;
        link.due = None;
        link.out.clear();
        link.peer.timer(now, &mut link.out);
        self.peer_sent(p);
    }

    /// Puts what peer `p` just sent on its way and re-arms its timer.
    pub(super) fn peer_sent(&mut self, p: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let ev = Ev::ToGuest { peer: p as u8 };
        for i in 0..link.out.len() {
            let (t, f) = link.out[i];
            link.to_guest.push_back(f);
            let at = match link.attach {
                // One queue into the tap or the VF: frames keep their order.
                Attach::Bridge { delay } | Attach::Veb { delay, .. } => {
                    link.wire_free = (t + delay).max(link.wire_free);
                    link.wire_free
                }
                // The load generator's NIC serializes its frames (and an
                // uplink's then cross the host's bridge).
                Attach::Wire { .. } | Attach::Uplink { .. } => {
                    let start = t.max(link.wire_free);
                    link.wire_free = start + self.m.link.wire_time(f.len());
                    let bridge = if let Attach::Uplink { delay } = link.attach {
                        delay
                    } else {
                        0
                    };
                    link.wire_free + self.m.link.propagation_ps + bridge
                }
            };
            self.q.schedule(at, ev);
        }
        let next = link.peer.next_timer();
        if next != link.timer {
            link.timer = next;
            link.due = next.map(|t| (t.max(now), self.q.reserve()));
            if let Some((at, key)) = link.due {
                if link.armed.last().is_none_or(|&a| (at, key) < a) {
                    link.armed.push((at, key));
                    let peer = p as u8;
                    self.q
                        .schedule_reserved(at, key, Ev::PeerTimer { peer, key });
                }
            }
        }
    }

    /// A frame from peer `p` reached the guest's side: the tap device
    /// (vhost's RX work) or the VF's RX ring.
    pub(super) fn peer_frame_arrives(&mut self, p: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let Some(f) = link.to_guest.pop_front() else {
            return;
        };
        match link.attach {
            Attach::Bridge { .. } | Attach::Uplink { .. } => {
                let Some(pv) = &mut self.pv else { return };
                if pv.vhost.tap_receive(f) {
                    let w = pv.costs.start_latency(pv.vhost.polling);
                    self.q.schedule_in(w, Ev::VhostStep { dev: 0 });
                }
            }
            Attach::Wire { vf } | Attach::Veb { vf, .. } => {
                let pkt = RxPacket {
                    len: f.len(),
                    arrived: now,
                    frame: f,
                };
                if let Ok((_, a)) = self.m.nic.receive(vf, pkt, now) {
                    self.nic_action(a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::Calibration;
    use crate::scenario::Scenario;

    /// A TCP stream from a peer on the host to a PV guest: the sender's
    /// retransmission deadline moves with every ACK.
    fn iperf_world(duration_s: f64) -> World {
        let text = format!(
            "scheme = \"kvm\"\nseed = 1\nduration_s = {duration_s}\nwarmup_s = 0.01\n\
             [net]\ndevice = \"virtio\"\n[workload.iperf]\ndirection = \"to-vm\"\n"
        );
        let s = Scenario::parse(&text, &[]).expect("scenario parses");
        World::build(&s, &Calibration::default_host()).expect("world builds")
    }

    /// Peer timers are re-armed lazily: over a long stream the queue holds
    /// a bounded handful of `PeerTimer` events, and nearly every one that
    /// pops is the peer's live deadline (eagerly, every ACK that moves the
    /// deadline queued one, and tens of thousands piled up stale).
    #[test]
    fn peer_timers_are_rearmed_lazily_and_the_queue_stays_bounded() {
        let mut w = iperf_world(0.2);
        let (mut popped, mut ran, mut most_queued, mut n) = (0u64, 0u64, 0usize, 0u64);
        while let Some((now, ev)) = w.q.pop_until(w.end) {
            if let Ev::PeerTimer { peer, key } = ev {
                popped += 1;
                if w.peers[peer as usize].due.is_some_and(|d| d.1 == key) {
                    ran += 1;
                }
            }
            w.dispatch(ev, now);
            n += 1;
            if n % 256 == 0 {
                let queued =
                    w.q.pending()
                        .filter(|e| matches!(e.1, Ev::PeerTimer { .. }))
                        .count();
                let armed: usize = w.peers.iter().map(|l| l.armed.len()).sum();
                assert_eq!(queued, armed, "the bookkeeping holds what is queued");
                most_queued = most_queued.max(queued);
            }
        }
        let sent = w.peers[0].peer.frames_out;
        let received = w.peers[0].peer.frames_in;
        eprintln!(
            "sent {sent} received {received} popped {popped} ran {ran} most_queued {most_queued}"
        );
        assert!(sent > 10_000, "a long stream: {sent} segments");
        assert!(received > 1_000, "acknowledged: {received} ACKs");
        assert!(most_queued <= 3, "{most_queued} PeerTimer events queued");
        assert!(
            popped <= 2 * ran + 10,
            "{popped} popped, {ran} ran the peer"
        );
    }
}
