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
use crate::hv::vhost::{Completion, Next, VhostCosts, VhostNet, VhostWorker, Vq};
use crate::hw::wire::Frame;
use crate::hw::x86::nic::RxPacket;
use crate::report::trace::TraceKind;
use crate::workloads::peer::PeerHost;
use std::collections::VecDeque;

/// The vhost side of the machine's virtio-net devices: their back ends and
/// the worker threads that run them.
pub(super) struct PvPath {
    /// Back end of each device (device d serves `m.virtio_net[d]`).
    pub(super) devs: Vec<VhostNet>,
    /// The guest's MSI-X vector for each device's queues (RX, TX): the
    /// irqfd routes.
    pub(super) vectors: Vec<[u8; 2]>,
    /// The worker threads.
    pub(super) workers: Vec<VhostWorker>,
    /// Per worker: how the platform runs it.
    pub(super) threads: Vec<IoThread>,
    pub(super) costs: VhostCosts,
    /// ES2's interruptible sleep.
    pub(super) nap: Time,
    /// Some worker polls from a side core (ELVIS).
    pub(super) side_core: bool,
}

/// How the platform runs a vhost worker thread.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct IoThread {
    /// Its host-scheduler thread, when it shares its core; otherwise the
    /// core is its own and it runs whenever it has work.
    pub(super) tid: Option<crate::hv::sched::Tid>,
    /// Current on its core (always, without a scheduler thread).
    pub(super) on_cpu: bool,
    /// A `VhostStep` for it is queued.
    pub(super) step_queued: bool,
    /// Generation of its nap timer (a nap woken early leaves a stale one).
    pub(super) nap_gen: u64,
}

/// Where a frame the guest sent left the machine's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// VF `vf`'s TX queue.
    Vf(u16),
    /// VM `vm`'s virtio-net device, through its tap.
    Tap(usize),
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
    pub(super) out: Vec<(Time, Frame)>,
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
    /// Behind the bridge: the receive work (per TCP segment, per UDP
    /// datagram) the vhost worker does for each frame it hands to the tap,
    /// since the bridge and this host's stack run in its context
    /// (`netif_rx_ni`); `None` elsewhere.
    stack_in_vhost: Option<(Time, Time)>,
    /// Its CPUs as host threads on this host (`host.peer_cores`), one per
    /// CPU; empty: it has CPUs of its own.
    pub(super) threads: Vec<super::peer_threads::PeerThread>,
    /// A timer came due while none of `threads` held a core.
    pub(super) timer_held: bool,
}

impl PeerLink {
    /// Peer host `peer`, attached to VM `vm`'s network by `attach`.
    pub(super) fn new(peer: PeerHost, attach: Attach, vm: usize) -> Self {
        // Behind the bridge frames reach the process through the tap, not
        // a NIC: no interrupt moderation, no GRO; and their receive path
        // runs in the vhost worker that sent them.
        let mut peer = match attach {
            Attach::Bridge { .. } => peer.without_nic(),
            _ => peer,
        };
        let stack_in_vhost = match attach {
            Attach::Bridge { .. } => Some(peer.receive_in_sender_context()),
            _ => None,
        };
        PeerLink {
            peer,
            attach,
            vm,
            to_peer: VecDeque::with_capacity(1024),
            to_guest: VecDeque::with_capacity(1024),
            out: Vec::with_capacity(1024),
            timer: None,
            due: None,
            armed: Vec::with_capacity(8),
            wire_free: 0,
            to_peer_last: 0,
            stack_in_vhost,
            threads: Vec::new(),
            timer_held: false,
        }
    }
}

impl World {
    /// An eventfd was signalled: a guest kick of one of vhost's queues.
    pub(super) fn pv_eventfd(&mut self, fd: u16) {
        let Some(pv) = &mut self.pv else { return };
        let Some((d, vq)) = pv
            .devs
            .iter_mut()
            .enumerate()
            .find_map(|(d, b)| b.kicked(fd).map(|vq| (d, vq)))
        else {
            return;
        };
        self.vhost_queue(d, vq);
    }

    /// `vhost_work_queue`: device `d`'s handler for `vq` has work; its
    /// worker wakes if it slept.
    fn vhost_queue(&mut self, d: usize, vq: Vq) {
        let Some(pv) = &mut self.pv else { return };
        let w = pv.devs[d].worker;
        if pv.workers[w].queue(&mut pv.devs[d], vq) {
            self.vhost_wake(w);
        }
    }

    /// Worker `w` was asleep (or napping) and has work: it runs after a
    /// wake-up, at once on its own core, or as the host scheduler decides.
    fn vhost_wake(&mut self, w: usize) {
        let Some(pv) = &mut self.pv else { return };
        if pv.workers[w].napping {
            // The interruptible sleep ends early.
            pv.workers[w].nap_over(&mut pv.devs);
            pv.threads[w].nap_gen += 1;
        }
        let lat = pv.costs.start_latency(pv.side_core);
        self.vhost_run_after(w, lat);
    }

    /// Worker `w`, awake, runs after `lat`: at once on a core of its own,
    /// or as the host scheduler decides.
    fn vhost_run_after(&mut self, w: usize, lat: Time) {
        let Some(pv) = &self.pv else { return };
        match pv.threads[w].tid {
            None => self.vhost_switched_in(w, lat),
            Some(tid) => self.sched_wake_thread(tid, lat),
        }
    }

    /// Worker `w` finished a unit of work (or just woke up, or was
    /// switched in).
    pub(super) fn pv_vhost_step(&mut self, w: usize) {
        let now = self.q.now();
        let Some(pv) = &mut self.pv else { return };
        pv.threads[w].step_queued = false;
        let vqs = &mut self.m.virtio_net[..];
        let mut done = pv.workers[w].finish(&mut pv.devs, vqs, &pv.costs);
        // The frame it handed to the tap goes up the bridge (and, for a
        // process on this host, its stack) in this thread before the
        // worker goes on.
        let (bridge, rx) = done
            .to_bridge
            .map_or((0, 0), |(d, f)| self.host_stack_in_vhost(d, &f));
        let Some(pv) = &mut self.pv else { return };
        if !pv.threads[w].on_cpu {
            // Preempted: the unit in flight is done; the rest waits for
            // the worker's next turn on the core.
            self.vhost_completion(done, now, rx);
            return;
        }
        let vqs = &mut self.m.virtio_net[..];
        let next = pv.workers[w].resume(&mut pv.devs, vqs, &pv.costs);
        done.extra += bridge + rx;
        pv.workers[w].counters.busy += bridge + rx;
        match next {
            Next::Unit(t) => {
                pv.threads[w].step_queued = true;
                let core = pv.workers[w].core;
                self.q
                    .schedule(now + done.extra + t, Ev::VhostStep { worker: w as u16 });
                let track = self.trace_vhost_track(w);
                let start = now + done.extra;
                self.trace_event(TraceKind::HostThread, core, track, start, start + t);
            }
            Next::Sleep => {
                if let Some(tid) = pv.threads[w].tid {
                    self.sched_block_thread(tid);
                }
            }
            Next::Nap => {
                pv.threads[w].nap_gen += 1;
                let gen = pv.threads[w].nap_gen;
                self.q.schedule(
                    now + done.extra + pv.nap,
                    Ev::VhostNapEnd {
                        worker: w as u16,
                        gen,
                    },
                );
                if let Some(tid) = pv.threads[w].tid {
                    self.sched_block_thread(tid);
                }
            }
        }
        self.vhost_completion(done, now, rx);
    }

    /// ES2's 10 µs sleep of worker `w` ran out.
    pub(super) fn pv_nap_end(&mut self, w: usize, gen: u64) {
        let Some(pv) = &mut self.pv else { return };
        if pv.threads[w].nap_gen != gen || !pv.workers[w].napping {
            return;
        }
        pv.workers[w].running = true;
        pv.workers[w].nap_over(&mut pv.devs);
        // schedule_hrtimeout: the timer wakes the thread (a wake-up).
        let lat = pv.costs.wakeup;
        self.vhost_run_after(w, lat);
    }

    /// The vhost worker's work for frame `f` of device `d` after it left
    /// the ring: the bridge's forwarding and the receive path of this
    /// host's stack, when the frame is for a process on this host
    /// (`Attach::Bridge`): (forwarding, receive path); zero for frames the
    /// host's NIC sends on.
    fn host_stack_in_vhost(&self, d: u16, f: &Frame) -> (Time, Time) {
        let Some(pv) = &self.pv else { return (0, 0) };
        let vm = pv.devs[d as usize].vm;
        self.host_stack_in_sender(vm, f)
    }

    /// The same work for a frame VM `vm`'s back end (vhost's worker, or
    /// kvmtool's TX thread in its `writev`) handed to the tap.
    pub(super) fn host_stack_in_sender(&self, vm: usize, f: &Frame) -> (Time, Time) {
        let Some(l) = self.peers.iter().find(|l| {
            l.vm == vm && l.peer.owns(f.flow) && matches!(l.attach, Attach::Bridge { .. })
        }) else {
            return (0, 0);
        };
        let (Attach::Bridge { delay }, Some((tcp, udp))) = (l.attach, l.stack_in_vhost) else {
            return (0, 0);
        };
        let rx = if crate::guest::app::Datagram::of(f).is_some() {
            udp
        } else {
            tcp
        };
        (delay, rx)
    }

    /// Carries out what a finished unit did: the frame goes to the bridge,
    /// the guest's interrupt is raised through the irqfd. A frame for a
    /// process on this host reaches its socket once the worker has run
    /// the receive path for it (`rx`, from [`Self::host_stack_in_vhost`]).
    fn vhost_completion(&mut self, done: Completion, now: Time, rx: Time) {
        let Some(pv) = &self.pv else { return };
        if let Some((d, f)) = done.to_bridge {
            let vm = pv.devs[d as usize].vm;
            self.frame_to_peer(f, Source::Tap(vm), now + rx);
        }
        let Some(pv) = &self.pv else { return };
        if let Some((d, queue)) = done.signal {
            let (vm, vector) = (pv.devs[d as usize].vm, pv.vectors[d as usize][queue]);
            self.irqfd(vm, vector);
        }
    }

    /// Worker `w` was switched in on its core by the host scheduler; it
    /// goes on with its work `after` this long (a wake-up's latency).
    pub(super) fn vhost_switched_in(&mut self, w: usize, after: Time) {
        let Some(pv) = &mut self.pv else { return };
        pv.threads[w].on_cpu = true;
        if !pv.threads[w].step_queued {
            pv.threads[w].step_queued = true;
            self.q
                .schedule_in(after, Ev::VhostStep { worker: w as u16 });
        }
    }

    /// Worker `w` was switched out (preempted, or it blocked).
    pub(super) fn vhost_switched_out(&mut self, w: usize) {
        if let Some(pv) = &mut self.pv {
            pv.threads[w].on_cpu = false;
        }
    }

    /// The polling worker (ELVIS) looks at the rings the guest may just
    /// have published to.
    pub(super) fn pv_poll_observe(&mut self) {
        let n = match &self.pv {
            Some(pv) if pv.side_core => pv.devs.len(),
            _ => return,
        };
        for d in 0..n {
            let Some(pv) = &mut self.pv else { return };
            if !pv.devs[d].polling {
                continue;
            }
            let [rx, tx] = pv.devs[d].poll_rings(&self.m.virtio_net[d]);
            for (has, vq) in [(tx, Vq::Tx), (rx, Vq::Rx)] {
                if has {
                    self.vhost_queue(d, vq);
                }
            }
        }
    }

    /// irqfd: the back end's signal becomes the scheme's virtual interrupt
    /// (`kvm_set_irq` → the MSI's destination, as KVM routes it, and
    /// ES2's redirection may rewrite it → the VM's LAPIC as the scheme
    /// keeps it).
    pub(super) fn irqfd(&mut self, vm: usize, vector: u8) {
        // ARM: the ARM scheme injects it (a virtio SPI through the vgic).
        if self.el2.is_some() {
            return self.el2_irqfd(vm, vector);
        }
        let now = self.q.now();
        self.checker.raised(vm, vector, now);
        let vcpu = self.hv.msi_destination(vm);
        let core = self.hv.vcpus[vcpu].core;
        self.trace_event(TraceKind::Raise { vector }, core, vm, now, now);
        let (mut cx, scheme) = self.cx();
        scheme.virtual_interrupt(&mut cx, vcpu, vector);
    }

    /// The head frame of VF `vf`'s TX queue `queue` left the wire:
    /// write-back, and the frame travels to the load generator.
    pub(super) fn vf_tx_done(&mut self, vf: u16, queue: u8) {
        let now = self.q.now();
        let Ok((f, irq, next)) = self.m.nic.tx_complete_on(vf, queue, now) else {
            return;
        };
        if let Some(t) = next {
            self.q.schedule(t, Ev::VfTxDone { vf, queue });
        }
        self.nic_action(irq);
        if let Some(f) = f {
            self.frame_to_peer(f, Source::Vf(vf), now);
        }
    }

    /// A frame the guest sent left its device (a VM's tap, or a VF's TX
    /// queue) at `now`: it travels to the peer that owns its flow (among
    /// those attached to that device: each VM numbers its flows from 1).
    pub(super) fn frame_to_peer(&mut self, f: Frame, from: Source, now: Time) {
        let Some(p) = self.peers.iter().position(|l| {
            l.peer.owns(f.flow)
                && match (l.attach, from) {
                    (Attach::Wire { vf } | Attach::Veb { vf, .. }, Source::Vf(v)) => vf == v,
                    (Attach::Bridge { .. } | Attach::Uplink { .. }, Source::Tap(vm)) => l.vm == vm,
                    _ => false,
                }
        }) else {
            return;
        };
        let link = &mut self.peers[p];
        let at = match link.attach {
            Attach::Bridge { delay } | Attach::Veb { delay, .. } => now + delay,
            // The host's NIC sends the bridged frame on the link, through
            // the port the VFs share.
            Attach::Uplink { delay } => {
                self.m.nic.pf_transmit(now + delay, &f, &self.m.link) + self.m.link.propagation_ps
            }
            Attach::Wire { .. } => now + self.m.link.propagation_ps,
        };
        let at = at.max(link.to_peer_last);
        link.to_peer_last = at;
        link.to_peer.push_back(f);
        self.q.schedule(at, Ev::ToPeer { peer: p as u16 });
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
        if self.peer_thread_holds(p, f) {
            return;
        }
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        link.out.clear();
        link.peer.receive(f, now, &mut link.out);
        self.peer_sent(p);
        self.peer_threads_settle(p);
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
                    let peer = p as u16;
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
        // A peer whose CPUs are host threads runs its timers on one that
        // holds a core; with none, when one next does.
        let Some(on) = self.peer_timer_cpu(p) else {
            return;
        };
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        link.out.clear();
        link.peer.timer_on(now, on, &mut link.out);
        self.peer_sent(p);
        self.peer_threads_settle(p);
    }

    /// Puts what peer `p` just sent on its way and re-arms its timer.
    pub(super) fn peer_sent(&mut self, p: usize) {
        let now = self.q.now();
        let Some(link) = self.peers.get_mut(p) else {
            return;
        };
        let ev = Ev::ToGuest { peer: p as u16 };
        for i in 0..link.out.len() {
            let (t, f) = link.out[i];
            // Into a VF's RX ring a GSO packet arrives as the frames the
            // sender's TSO cut it into, each when its last bit is in; the
            // guest's GRO may merge them again. Into the host (tap, or the
            // PF then the bridge) it stays one packet: the host's own GRO
            // re-merges a train that arrives back to back (named
            // assumption, docs/calibration-sources.md §9).
            let split = matches!(link.attach, Attach::Wire { .. } | Attach::Veb { .. });
            let parts = if split { f.gso_segs() } else { 1 };
            for k in 0..parts {
                let f = if split { f.gso_segment(k) } else { f };
                link.to_guest.push_back(f);
                let at = match link.attach {
                    // One queue into the tap or the VF: frames keep their
                    // order.
                    Attach::Bridge { delay } | Attach::Veb { delay, .. } => {
                        link.wire_free = (t + delay).max(link.wire_free);
                        link.wire_free
                    }
                    // The load generator's NIC serializes its frames (and
                    // an uplink's then cross the host's bridge).
                    Attach::Wire { .. } | Attach::Uplink { .. } => {
                        // Every load generator's frames arrive through the
                        // host's one port: they share its receive wire.
                        let start = t.max(link.wire_free).max(self.port_rx_free);
                        link.wire_free = start + self.m.link.frame_wire_time(&f);
                        self.port_rx_free = link.wire_free;
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
        }
        // A timer held for the peer's threads runs when one gets a core.
        let next = link.peer.next_timer().filter(|_| !link.timer_held);
        if next != link.timer {
            link.timer = next;
            link.due = next.map(|t| (t.max(now), self.q.reserve()));
            if let Some((at, key)) = link.due {
                if link.armed.last().is_none_or(|&a| (at, key) < a) {
                    link.armed.push((at, key));
                    let peer = p as u16;
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
                let (vm, uplink) = (link.vm, matches!(link.attach, Attach::Uplink { .. }));
                if self.kvmtool.is_some() {
                    return self.kvmtool_host_receive(vm, f, uplink);
                }
                let Some(d) = self.net_dev_of_vm.get(vm).copied().flatten() else {
                    return;
                };
                let Some(pv) = &mut self.pv else { return };
                if pv.devs[d].tap_receive(f) {
                    self.vhost_queue(d, Vq::Rx);
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
