//! The paravirtual path on the platform: the vhost-net worker on its host
//! core, the bridge between its tap device and a peer process on the host,
//! and the irqfd that turns the worker's signal into the scheme's virtual
//! interrupt. Frames cross the bridge in order with a fixed forwarding
//! delay, so each direction is a FIFO and events carry no frames.

use super::event::Ev;
use super::World;
use crate::engine::Time;
use crate::hv::vhost::{VhostCosts, VhostNet};
use crate::hw::wire::Frame;
use crate::workloads::peer::PeerHost;
use std::collections::VecDeque;

/// Everything on the host side of a virtio-net device.
pub(super) struct PvPath {
    pub(super) vhost: VhostNet,
    pub(super) costs: VhostCosts,
    /// The guest's MSI-X vector for each queue (RX, TX): the irqfd routes.
    pub(super) vectors: [u8; 2],
    pub(super) peer: PeerHost,
    pub(super) bridge: Time,
    to_peer: VecDeque<Frame>,
    to_guest: VecDeque<Frame>,
    peer_out: Vec<(Time, Frame)>,
    peer_timer: Option<Time>,
    peer_timer_gen: u64,
}

impl PvPath {
    pub(super) fn new(
        vhost: VhostNet,
        costs: VhostCosts,
        vectors: [u8; 2],
        peer: PeerHost,
        bridge: Time,
    ) -> Self {
        PvPath {
            vhost,
            costs,
            vectors,
            peer,
            bridge,
            to_peer: VecDeque::with_capacity(1024),
            to_guest: VecDeque::with_capacity(1024),
            peer_out: Vec::with_capacity(1024),
            peer_timer: None,
            peer_timer_gen: 0,
        }
    }
}

impl World {
    /// An eventfd was signalled: a guest kick of one of vhost's queues.
    pub(super) fn pv_eventfd(&mut self, fd: u16) {
        let Some(pv) = &mut self.pv else { return };
        if pv.vhost.kick(fd) == Some(true) {
            let w = pv.costs.wakeup;
            self.q.schedule_in(w, Ev::VhostStep { dev: 0 });
        }
    }

    /// The vhost worker finished a unit of work (or just woke up).
    pub(super) fn pv_vhost_step(&mut self) {
        let now = self.q.now();
        let Some(pv) = &mut self.pv else { return };
        let vq = &mut self.m.virtio_net[pv.vhost.dev];
        let done = pv.vhost.complete(vq, &pv.costs);
        if let Some(f) = done.to_bridge {
            pv.to_peer.push_back(f);
            self.q.schedule(now + pv.bridge, Ev::BridgeToPeer);
        }
        // None: asleep until the next kick or tap frame wakes it.
        if let Some(cost) = pv.vhost.begin(vq, &pv.costs) {
            self.q
                .schedule(now + done.extra + cost, Ev::VhostStep { dev: 0 });
        }
        if let Some(queue) = done.signal {
            let vector = pv.vectors[queue];
            let vm = pv.vhost.vm;
            self.irqfd(vm, vector);
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

    /// A frame from the guest reached the peer through the bridge.
    pub(super) fn pv_bridge_to_peer(&mut self) {
        let now = self.q.now();
        let Some(pv) = &mut self.pv else { return };
        let Some(f) = pv.to_peer.pop_front() else {
            return;
        };
        pv.peer_out.clear();
        pv.peer.receive(f, now, &mut pv.peer_out);
        self.pv_peer_sent();
    }

    /// A peer timer came due.
    pub(super) fn pv_peer_timer(&mut self, gen: u64) {
        let now = self.q.now();
        let Some(pv) = &mut self.pv else { return };
        if gen != pv.peer_timer_gen {
            return;
        }
        pv.peer_timer = None;
        pv.peer_out.clear();
        pv.peer.timer(now, &mut pv.peer_out);
        self.pv_peer_sent();
    }

    /// Puts what the peer just sent on the bridge and re-arms its timer.
    fn pv_peer_sent(&mut self) {
        let Some(pv) = &mut self.pv else { return };
        for i in 0..pv.peer_out.len() {
            let (t, f) = pv.peer_out[i];
            pv.to_guest.push_back(f);
            self.q.schedule(t + pv.bridge, Ev::BridgeToGuest);
        }
        let next = pv.peer.next_timer();
        if next != pv.peer_timer {
            pv.peer_timer = next;
            pv.peer_timer_gen += 1;
            if let Some(t) = next {
                let gen = pv.peer_timer_gen;
                self.q.schedule(t.max(self.q.now()), Ev::PeerTimer { gen });
            }
        }
    }

    /// A frame from the peer reached the tap device: vhost's RX work.
    pub(super) fn pv_bridge_to_guest(&mut self) {
        let Some(pv) = &mut self.pv else { return };
        let Some(f) = pv.to_guest.pop_front() else {
            return;
        };
        if pv.vhost.tap_receive(f) {
            let w = pv.costs.wakeup;
            self.q.schedule_in(w, Ev::VhostStep { dev: 0 });
        }
    }
}
