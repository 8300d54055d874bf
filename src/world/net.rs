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
    to_peer: VecDeque<Frame>,
    to_guest: VecDeque<Frame>,
    out: Vec<(Time, Frame)>,
    timer: Option<Time>,
    timer_gen: u64,
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
            to_peer: VecDeque::with_capacity(1024),
            to_guest: VecDeque::with_capacity(1024),
            out: Vec::with_capacity(1024),
            timer: None,
            timer_gen: 0,
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
            self.frame_to_peer(f, now);
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
            self.frame_to_peer(f, now);
        }
    }

    /// A frame the guest sent left its device (the tap, or the VF's TX
    /// queue) at `now`: it travels to the peer that owns its flow.
    fn frame_to_peer(&mut self, f: Frame, now: Time) {
        let Some(p) = self.peers.iter().position(|l| l.peer.owns(f.flow)) else {
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

    /// A timer of peer `p` came due.
    pub(super) fn peer_timer(&mut self, p: usize, gen: u64) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        if gen != link.timer_gen {
            return;
        }
        link.timer = None;
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
            link.timer_gen += 1;
            if let Some(t) = next {
                let gen = link.timer_gen;
                let peer = p as u8;
                self.q.schedule(t.max(now), Ev::PeerTimer { peer, gen });
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
