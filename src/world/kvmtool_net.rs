//! kvm-tools' userspace virtio-net back end on the platform
//! (`net.backend = "kvmtool-tap"`; the mechanism is `hv::kvmtool_net`).
//!
//! Each device's three threads (ioeventfd, TX, RX) are threads of the host
//! scheduler pinned to `host.io_cores[d % len]`, as a vhost worker is: they
//! share that core with each other and with whatever else runs there (the
//! vCPU, for Baseline's `io_cores = [1]`). A thread's unit of work runs
//! while it is on its core; preempted, the unit in flight finishes and the
//! rest waits for its next turn. Kicks arrive as KVM's eventfd signals
//! (`Ev::Eventfd`); frames for the guest arrive on the tap from the bridge;
//! frames the TX thread writes leave through the bridge as a vhost
//! worker's do; the guest's interrupt is raised through the scheme as an
//! irqfd's is (`KVM_IRQ_LINE` reaches the same `kvm_set_msi`).

use super::event::Ev;
use super::net::Attach;
use super::vcanal::{net_rx_action, NicItr};
use super::World;
use crate::engine::Time;
use crate::hv::kvmtool_net::{Done, KvmtoolCosts, KvmtoolNet, Next, Role, THREADS};
use crate::hv::sched::Tid;
use crate::hw::wire::Frame;
use std::collections::VecDeque;

/// The kvmtool side of the machine's virtio-net devices.
pub(super) struct KvmtoolPath {
    /// Back end of each device (device d serves `m.virtio_net[d]`).
    pub(super) devs: Vec<KvmtoolNet>,
    /// The guest's MSI-X vector for each device's queues (RX, TX).
    pub(super) vectors: Vec<[u8; 2]>,
    /// Thread `d * THREADS + role` of device d.
    pub(super) threads: Vec<HostThread>,
    pub(super) costs: KvmtoolCosts,
    /// The host's own NIC under the bridge, when a VM's peer is the load
    /// generator across the link (`net.peer = "remote"`).
    pub(super) host_nic: Option<HostNic>,
}

/// Per-frame costs of the host's own stack between its NIC and the taps
/// (Linux 3.5: ixgbe, the bridge, tun), on the VM host's cores.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HostNicCosts {
    /// ixgbe's MSI-X handler (`ixgbe_msix_clean_rings`: napi_schedule).
    pub(super) irq: Time,
    /// `net_rx_action` and one ixgbe poll call, past its frames.
    pub(super) napi_poll: Time,
    /// A received frame: the driver's descriptor clean and skb
    /// (`guest.rx_per_packet_ns` less `guest.rx_protocol_ns`), the bridge's
    /// forwarding (`peer.bridge_ns`) and `tun_net_xmit` onto the tap's
    /// queue with the reader's wake-up (`kvmtool.tun_xmit_ns`).
    pub(super) rx_frame: Time,
    /// A frame the TX thread's `writev` hands on: `netif_rx_ni`'s softirq
    /// runs the bridge's forwarding (`peer.bridge_ns`) and `dev_queue_xmit`
    /// to ixgbe's `ixgbe_xmit_frame` (`guest.vf_xmit_ns`, the same
    /// descriptor work as ixgbevf's) in the thread's context.
    pub(super) tx_frame: Time,
}

/// The VM host's NIC (the 82599 PF under the bridge) and its receive path:
/// frames from the link wait in its RX ring for the moderated interrupt
/// (ixgbe's adaptive ITR, as on vCanal's host NIC), which goes to
/// `irq_core` as a host vector (`hv::host::HOST_NIC_VECTOR`); the NET_RX
/// softirq runs there at once, NAPI polls of at most [`NAPI_WEIGHT`]
/// frames within `net_rx_action`'s budget, and each frame crosses the
/// bridge onto its VM's tap, waking kvm-tools' RX thread.
pub(super) struct HostNic {
    /// The core its interrupt goes to (the paper's affinity pins it to the
    /// I/O core, §3).
    pub(super) irq_core: usize,
    nic: NicItr,
    /// Frames received, not yet taken up the stack: (VM, frame).
    ring: VecDeque<(usize, Frame)>,
    /// Frames taken up the stack, handed to their taps when the softirq
    /// that took them ends.
    done: VecDeque<(usize, Frame)>,
    costs: HostNicCosts,
    /// When the receive path last taken ends.
    busy_until: Time,
    /// ksoftirqd's wake-up, and whether a pass of it is queued.
    softirqd_wakeup: Time,
    softirqd_queued: bool,
    pub(super) counters: HostNicCounters,
}

/// What the host NIC's receive path did (the measured interval).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HostNicCounters {
    pub(super) irqs: u64,
    pub(super) napi_polls: u64,
    pub(super) rx_frames: u64,
    pub(super) tx_frames: u64,
    pub(super) softirq_deferrals: u64,
    /// Time on `irq_core` in the receive path.
    pub(super) busy: Time,
    /// Time in the TX threads' `writev`s past the tap (bridge and xmit).
    pub(super) tx_busy: Time,
}

impl HostNic {
    pub(super) fn new(
        irq_core: usize,
        nic: NicItr,
        costs: HostNicCosts,
        softirqd_wakeup: Time,
    ) -> Self {
        HostNic {
            irq_core,
            nic,
            ring: VecDeque::with_capacity(512),
            done: VecDeque::with_capacity(512),
            costs,
            busy_until: 0,
            softirqd_wakeup,
            softirqd_queued: false,
            counters: HostNicCounters::default(),
        }
    }

    /// The receive path from `at`: the handler (`irq`; not on ksoftirqd's
    /// pass) and NAPI's polls until the ring is empty or the softirq's
    /// budget ([`NETDEV_BUDGET`] frames, [`SOFTIRQ_TIME`]) is spent; the
    /// frames taken move to `done`. Returns the time it took and whether
    /// frames were left for ksoftirqd.
    fn receive(&mut self, at: Time, irq: bool) -> (Time, bool) {
        let mut t = at;
        if irq {
            self.counters.irqs += 1;
            self.nic
                .take_irq(at, self.ring.iter().map(|(_, f)| f.len()));
            t += self.costs.irq;
        }
        let rx_frame = self.costs.rx_frame;
        let r = net_rx_action(at, t, self.costs.napi_poll, |_| {
            let x = self.ring.pop_front()?;
            self.counters.rx_frames += 1;
            self.done.push_back(x);
            Some(rx_frame)
        });
        self.counters.napi_polls += r.polls;
        if r.left {
            self.counters.softirq_deferrals += 1;
        } else {
            self.nic.napi_complete();
        }
        (r.end - at, r.left)
    }
}

/// How the platform runs one of the back end's threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostThread {
    /// The core it is pinned to.
    pub(super) core: usize,
    /// Host interrupt time taken on its core while it ran there: its next
    /// unit of work starts that much later.
    pub(super) stolen: Time,
    /// Its host-scheduler thread (set when the scheduler is built).
    pub(super) tid: Tid,
    /// Current on its core.
    pub(super) on_cpu: bool,
    /// A `KvmtoolStep` for it is queued.
    pub(super) step_queued: bool,
}

impl KvmtoolPath {
    /// The back ends of `devs` (device index, VM, kick eventfds), their
    /// threads on `io_cores`.
    pub(super) fn new(
        devs: Vec<KvmtoolNet>,
        vectors: Vec<[u8; 2]>,
        io_cores: &[usize],
        costs: KvmtoolCosts,
    ) -> Self {
        let threads = (0..devs.len() * THREADS)
            .map(|t| HostThread {
                core: io_cores[(t / THREADS) % io_cores.len()],
                stolen: 0,
                tid: 0,
                on_cpu: false,
                step_queued: false,
            })
            .collect();
        KvmtoolPath {
            devs,
            vectors,
            threads,
            costs,
            host_nic: None,
        }
    }

    /// The core of each thread, in thread order (for the scheduler).
    pub(super) fn cores(&self) -> Vec<usize> {
        self.threads.iter().map(|t| t.core).collect()
    }
}

impl World {
    /// KVM signalled eventfd `fd`: a queue notify of a kvmtool device wakes
    /// its ioeventfd thread out of `epoll_wait`.
    pub(super) fn kvmtool_eventfd(&mut self, fd: u16) {
        let Some(k) = &mut self.kvmtool else { return };
        let Some((d, wake)) = k
            .devs
            .iter_mut()
            .enumerate()
            .find_map(|(d, b)| b.kick(fd).map(|w| (d, w)))
        else {
            return;
        };
        if wake {
            self.kvmtool_wake(d * THREADS + Role::Ioeventfd as usize);
        }
    }

    /// At power-on: the guest's driver probe filled its RX ring and wrote
    /// the RX queue's notify port (`virtnet_probe`; the guest model does
    /// not deliver that kick, since vhost's RX handler runs on tap
    /// readiness). kvmtool's RX thread needs it to leave its first
    /// condition wait, so it is delivered here through the eventfd path.
    pub(super) fn kvmtool_start(&mut self) {
        let Some(k) = &self.kvmtool else { return };
        let fds: Vec<u16> = k.devs.iter().map(|d| d.kick_fd[0]).collect();
        for fd in fds {
            self.kvmtool_eventfd(fd);
        }
    }

    /// A frame for VM `vm` reaches the host: from the load generator across
    /// the link (`uplink`) it lands in the host NIC's RX ring and waits for
    /// the receive path; from a process on this host it reaches the tap
    /// from the bridge at once.
    pub(super) fn kvmtool_host_receive(&mut self, vm: usize, f: Frame, uplink: bool) {
        let Some(h) = self.kvmtool.as_mut().and_then(|k| k.host_nic.as_mut()) else {
            return self.kvmtool_tap_receive(vm, f);
        };
        if !uplink {
            return self.kvmtool_tap_receive(vm, f);
        }
        h.ring.push_back((vm, f));
        if !h.nic.moderated() {
            return self.kvmtool_raise_nic_irq();
        }
        if h.nic.armed.is_none() && !h.nic.fired {
            let now = self.q.now();
            let at = h.nic.last.map_or(now, |t| t + h.nic.current()).max(now);
            h.nic.armed = Some(at);
            self.q.schedule(at, Ev::KvmtoolNicIrq);
        }
    }

    /// The host NIC's moderated interrupt fires.
    pub(super) fn kvmtool_nic_irq(&mut self) {
        let now = self.q.now();
        let Some(h) = self.kvmtool.as_mut().and_then(|k| k.host_nic.as_mut()) else {
            return;
        };
        if h.nic.armed != Some(now) {
            return;
        }
        h.nic.armed = None;
        h.nic.fired = true;
        self.kvmtool_raise_nic_irq();
    }

    /// The NIC's MSI-X goes to its core as a host vector; on a vCPU's core
    /// it costs that vCPU an external-interrupt exit, in which the receive
    /// path runs.
    fn kvmtool_raise_nic_irq(&mut self) {
        let Some(core) = self
            .kvmtool
            .as_ref()
            .and_then(|k| k.host_nic.as_ref())
            .map(|h| h.irq_core)
        else {
            return;
        };
        self.q.schedule_in(
            0,
            Ev::ApicArrive {
                core: core as u16,
                vector: crate::hv::host::HOST_NIC_VECTOR,
                mode: crate::hw::x86::lapic::DeliveryMode::Fixed,
            },
        );
    }

    /// Host code on `core` took the host NIC's interrupt (the vCanal
    /// service's NIC, or the bridged host's): its receive path runs there.
    /// Returns the time charged.
    pub(super) fn host_nic_irq(&mut self, core: usize) -> Time {
        self.canal_host_nic_irq(core) + self.kvmtool_softirq(core, true)
    }

    /// The bridged host's receive path on `core`: the hard interrupt's
    /// (`irq`), or ksoftirqd's pass over what the last softirq left. A
    /// kvm-tools thread running there is delayed by it; the frames reach
    /// their taps when it ends (the RX threads wake then).
    fn kvmtool_softirq(&mut self, core: usize, irq: bool) -> Time {
        let now = self.q.now();
        let measured = now >= self.measure_start;
        let current = self
            .sched
            .as_ref()
            .and_then(|st| st.s.current(core).and_then(|t| st.kvmtool_of(t)));
        let Some(k) = self.kvmtool.as_mut() else {
            return 0;
        };
        let Some(h) = k.host_nic.as_mut() else {
            return 0;
        };
        if h.irq_core != core {
            return 0;
        }
        let start = now.max(h.busy_until);
        let (t, left) = h.receive(start, irq);
        h.busy_until = start + t;
        if measured {
            h.counters.busy += t;
        }
        if let Some(th) = current {
            k.threads[th].stolen += t;
        }
        if left && !h.softirqd_queued {
            h.softirqd_queued = true;
            self.q
                .schedule(start + t + h.softirqd_wakeup, Ev::KvmtoolSoftirqd);
        }
        if !h.done.is_empty() {
            self.q.schedule(start + t, Ev::KvmtoolHostRxDone);
        }
        start + t - now
    }

    /// ksoftirqd runs the receive path the softirq left over.
    pub(super) fn kvmtool_softirqd(&mut self) {
        let Some(h) = self.kvmtool.as_mut().and_then(|k| k.host_nic.as_mut()) else {
            return;
        };
        h.softirqd_queued = false;
        let core = h.irq_core;
        self.kvmtool_softirq(core, false);
    }

    /// A softirq ended: the frames it took are on their taps.
    pub(super) fn kvmtool_host_rx_done(&mut self) {
        loop {
            let Some(h) = self.kvmtool.as_mut().and_then(|k| k.host_nic.as_mut()) else {
                return;
            };
            let Some((vm, f)) = h.done.pop_front() else {
                return;
            };
            self.kvmtool_tap_receive(vm, f);
        }
    }

    /// The host's transmit work for frame `f` of VM `vm` past the tap, in
    /// the TX thread's `writev`: the bridge and the NIC's xmit when the
    /// frame leaves through the host NIC (its peer is across the link).
    fn kvmtool_uplink_tx(&self, vm: usize, f: &Frame) -> Time {
        let Some(h) = self.kvmtool.as_ref().and_then(|k| k.host_nic.as_ref()) else {
            return 0;
        };
        let uplink = self.peers.iter().any(|l| {
            l.vm == vm && l.peer.owns(f.flow) && matches!(l.attach, Attach::Uplink { .. })
        });
        if uplink {
            h.costs.tx_frame
        } else {
            0
        }
    }

    /// A frame from the bridge reaches VM `vm`'s tap; the RX thread blocked
    /// in `readv` wakes.
    fn kvmtool_tap_receive(&mut self, vm: usize, f: Frame) {
        let Some(d) = self.net_dev_of_vm.get(vm).copied().flatten() else {
            return;
        };
        let Some(k) = &mut self.kvmtool else { return };
        if k.devs[d].tap_receive(f) {
            self.kvmtool_wake(d * THREADS + Role::Rx as usize);
        }
    }

    /// Thread `t` was asleep and must run: after a wake-up, as the host
    /// scheduler decides.
    fn kvmtool_wake(&mut self, t: usize) {
        let Some(k) = &self.kvmtool else { return };
        let (tid, lat) = (k.threads[t].tid, k.costs.wakeup);
        self.sched_wake_thread(tid, lat);
    }

    /// Thread `t` finished a unit of work (or was switched in).
    pub(super) fn kvmtool_step(&mut self, t: usize) {
        let now = self.q.now();
        let Some(k) = &mut self.kvmtool else { return };
        k.threads[t].step_queued = false;
        let (d, role) = (t / THREADS, Role::of(t));
        let dev = k.devs[d].dev;
        let done = k.devs[d].finish(role, &mut self.m.virtio_net[dev]);
        // A frame written to the tap runs the bridge (and, for a process
        // on this host, its receive path) inside the writev.
        // Towards the link, the bridge and the host NIC's xmit run in
        // the writev too (netif_rx_ni's softirq).
        let (bridge, rx, xmit) = match done.to_tap {
            Some(f) => {
                let vm = k_vm(&self.kvmtool, d);
                let (b, r) = self.host_stack_in_sender(vm, &f);
                (b, r, self.kvmtool_uplink_tx(vm, &f))
            }
            None => (0, 0, 0),
        };
        let measured = now >= self.measure_start;
        let Some(k) = &mut self.kvmtool else { return };
        let extra = bridge + rx + xmit;
        k.devs[d].threads[role as usize].busy += extra;
        if let (true, Some(h)) = (xmit > 0, k.host_nic.as_mut()) {
            if measured {
                h.counters.tx_frames += 1;
                h.counters.tx_busy += xmit;
            }
        }
        if k.threads[t].on_cpu {
            let next = k.devs[d].resume(role, &mut self.m.virtio_net[dev], &k.costs);
            match next {
                Next::Unit(w) => {
                    k.threads[t].step_queued = true;
                    let stolen = std::mem::take(&mut k.threads[t].stolen);
                    self.q.schedule(
                        now + extra + stolen + w,
                        Ev::KvmtoolStep { thread: t as u16 },
                    );
                }
                Next::Sleep => {
                    k.threads[t].stolen = 0;
                    let tid = k.threads[t].tid;
                    self.sched_block_thread(tid);
                }
            }
        }
        self.kvmtool_done(d, done, now + rx + xmit);
    }

    /// Carries out what a finished unit did.
    fn kvmtool_done(&mut self, d: usize, done: Done, tap_at: Time) {
        let Some(k) = &self.kvmtool else { return };
        let vm = k.devs[d].vm;
        if let Some(f) = done.to_tap {
            self.frame_to_peer(f, super::net::Source::Tap(vm), tap_at);
        }
        let Some(k) = &self.kvmtool else { return };
        if let Some(q) = done.signal {
            let vector = k.vectors[d][q];
            // KVM_IRQ_LINE on the queue's MSI route: kvm_set_msi, as an
            // irqfd's injection.
            self.irqfd(vm, vector);
        }
        if let Some(r) = done.wake {
            self.kvmtool_wake(d * THREADS + r as usize);
        }
    }

    /// Thread `t` was switched in; it goes on `after` this long.
    pub(super) fn kvmtool_switched_in(&mut self, t: usize, after: Time) {
        let Some(k) = &mut self.kvmtool else { return };
        k.threads[t].on_cpu = true;
        // Woken, or its unit in flight finished while it was off the core:
        // it goes on from there (a unit still in flight ends by itself).
        if !k.threads[t].step_queued {
            k.threads[t].step_queued = true;
            self.q
                .schedule_in(after, Ev::KvmtoolStep { thread: t as u16 });
        }
    }

    /// Thread `t` was switched out (preempted, or it blocked).
    pub(super) fn kvmtool_switched_out(&mut self, t: usize) {
        if let Some(k) = &mut self.kvmtool {
            k.threads[t].on_cpu = false;
            k.threads[t].stolen = 0;
        }
    }
}

/// The VM of device `d`.
fn k_vm(k: &Option<Box<KvmtoolPath>>, d: usize) -> usize {
    k.as_ref().map_or(0, |k| k.devs[d].vm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::Calibration;
    use crate::scenario::Scenario;
    use crate::world::vcanal::NAPI_WEIGHT;

    /// A 1-vCPU VM streaming to the load generator across the link through
    /// kvm-tools' back end, its threads on `io`.
    fn world(io: usize, sets: &[&str]) -> World {
        let text = format!(
            "scheme = \"kvm\"\nseed = 3\nduration_s = 0.02\nwarmup_s = 0.005\n\
             [machine]\ncores = 8\n[net]\ndevice = \"virtio\"\npeer = \"remote\"\n\
             backend = \"kvmtool-tap\"\n[host]\nio_cores = [{io}]\n\
             [workload.netperf]\ntest = \"tcp-stream\"\nmsg_bytes = 16384\n"
        );
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let s = Scenario::parse(&text, &sets).expect("scenario parses");
        World::build(&s, &Calibration::default_host()).expect("world builds")
    }

    /// The bridged host's receive path keeps NAPI's weight (64 frames a
    /// poll) and `net_rx_action`'s budget (300 frames): past it the rest
    /// waits for ksoftirqd, whose pass takes it without a hard interrupt;
    /// each frame costs the driver, the bridge and `tun_net_xmit`.
    #[test]
    fn the_host_receive_path_keeps_napis_weight_and_the_softirq_budget() {
        let w = world(7, &[]);
        let k = w.kvmtool.expect("kvm-tools' back end");
        let mut h = k.host_nic.expect("a host NIC for a peer across the link");
        assert_eq!(h.irq_core, 7, "with the back end's threads");
        for i in 0..400 {
            h.ring.push_back((0, Frame::udp(1, 64, i, 0)));
        }
        let (t, left) = h.receive(0, true);
        assert!(left, "budget spent");
        assert_eq!(h.counters.napi_polls, 5);
        assert_eq!(h.ring.len(), 400 - 5 * NAPI_WEIGHT);
        assert_eq!(h.done.len(), 5 * NAPI_WEIGHT, "taken up the stack");
        assert_eq!(h.counters.softirq_deferrals, 1);
        assert_eq!(
            t,
            h.costs.irq + 5 * h.costs.napi_poll + 320 * h.costs.rx_frame,
            "the handler, five polls, 320 frames"
        );
        let (_, left) = h.receive(t, false);
        assert!(!left, "ksoftirqd drains the rest");
        assert!(h.ring.is_empty());
        assert_eq!(h.counters.irqs, 1, "no hard interrupt for ksoftirqd's pass");
        // In order, to their VMs.
        let seqs: Vec<u64> = h
            .done
            .iter()
            .filter_map(|(_, f)| match f.transport {
                crate::hw::wire::Transport::Udp { seq, .. } => Some(seq),
                _ => None,
            })
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "frames keep their order"
        );
        assert_eq!(seqs.len(), 400);
    }

    /// `net.host_nic_irq_core` moves the interrupt; outside the machine it
    /// is refused by key, and without kvm-tools' back end too.
    #[test]
    fn the_host_nics_interrupt_core_is_placed_and_checked() {
        let w = world(1, &["net.host_nic_irq_core=0"]);
        let h = w.kvmtool.and_then(|k| k.host_nic).expect("host NIC");
        assert_eq!(h.irq_core, 0);
        let w = world(1, &[]);
        let h = w.kvmtool.and_then(|k| k.host_nic).expect("host NIC");
        assert_eq!(h.irq_core, 1, "with the threads, on the vCPU's core");
        let text = "scheme = \"kvm\"\nduration_s = 0.01\n[machine]\ncores = 8\n[net]\ndevice = \"virtio\"\n\
                    peer = \"remote\"\nbackend = \"kvmtool-tap\"\nhost_nic_irq_core = 8\n\
                    [workload.netperf]\ntest = \"tcp-stream\"\n";
        let s = Scenario::parse(text, &[]).expect("parses");
        let e = World::build(&s, &Calibration::default_host())
            .err()
            .expect("core 8 of 8 refused")
            .to_string();
        assert!(e.contains("host_nic_irq_core"), "{e}");
        let e = Scenario::parse(text, &["net.backend=vhost".to_string()])
            .expect_err("vhost has no such path")
            .to_string();
        assert!(e.contains("host_nic_irq_core"), "{e}");
    }
}
