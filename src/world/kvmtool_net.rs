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
use super::World;
use crate::engine::Time;
use crate::hv::kvmtool_net::{Done, KvmtoolCosts, KvmtoolNet, Next, Role, THREADS};
use crate::hv::sched::Tid;
use crate::hw::wire::Frame;

/// The kvmtool side of the machine's virtio-net devices.
pub(super) struct KvmtoolPath {
    /// Back end of each device (device d serves `m.virtio_net[d]`).
    pub(super) devs: Vec<KvmtoolNet>,
    /// The guest's MSI-X vector for each device's queues (RX, TX).
    pub(super) vectors: Vec<[u8; 2]>,
    /// Thread `d * THREADS + role` of device d.
    pub(super) threads: Vec<HostThread>,
    pub(super) costs: KvmtoolCosts,
}

/// How the platform runs one of the back end's threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostThread {
    /// The core it is pinned to.
    pub(super) core: usize,
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

    /// A frame from the bridge reaches VM `vm`'s tap; the RX thread blocked
    /// in `readv` wakes.
    pub(super) fn kvmtool_tap_receive(&mut self, vm: usize, f: Frame) {
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
        let (bridge, rx) = match done.to_tap {
            Some(f) => self.host_stack_in_sender(k_vm(&self.kvmtool, d), &f),
            None => (0, 0),
        };
        let Some(k) = &mut self.kvmtool else { return };
        let extra = bridge + rx;
        k.devs[d].threads[role as usize].busy += extra;
        if k.threads[t].on_cpu {
            let next = k.devs[d].resume(role, &mut self.m.virtio_net[dev], &k.costs);
            match next {
                Next::Unit(w) => {
                    k.threads[t].step_queued = true;
                    self.q
                        .schedule(now + extra + w, Ev::KvmtoolStep { thread: t as u16 });
                }
                Next::Sleep => {
                    let tid = k.threads[t].tid;
                    self.sched_block_thread(tid);
                }
            }
        }
        self.kvmtool_done(d, done, now + rx);
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
        }
    }
}

/// The VM of device `d`.
fn k_vm(k: &Option<Box<KvmtoolPath>>, d: usize) -> usize {
    k.as_ref().map_or(0, |k| k.devs[d].vm)
}
