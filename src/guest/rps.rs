//! Receive packet steering, as Linux 3.x–4.4 does it (`net/core/dev.c`):
//!
//! * the NAPI poll on the CPU that took the device interrupt hands each
//!   packet to `netif_receive_skb`, where `get_rps_cpu` picks a CPU of the
//!   receive queue's `rps_cpus` map by the packet's flow hash and
//!   `enqueue_to_backlog` queues it on that CPU's backlog (its
//!   `input_pkt_queue`, at most `netdev_max_backlog` packets);
//! * a backlog that was idle is scheduled: on this CPU directly
//!   (`____napi_schedule`), on another by putting it on this CPU's
//!   `rps_ipi_list` (`rps_ipi_queued`);
//! * at the end of `net_rx_action`, `net_rps_action_and_irq_enable` sends
//!   each CPU on that list one `smp_call_function_single_async`: a
//!   CALL_FUNCTION_SINGLE_VECTOR IPI through the ICR;
//! * on the target, the IPI's handler runs `rps_trigger_softirq`, which
//!   puts the backlog on its poll list and raises NET_RX; `process_backlog`
//!   then runs the packets' protocol processing there (`__netif_receive_skb`
//!   up to the socket and the wake-up of its task), up to the weight per
//!   poll, and marks the backlog idle once it is empty.
//!
//! Another batch for a backlog that is still scheduled is only queued: no
//! IPI. RFS (steering to the CPU the consuming task last ran on) is not
//! modelled.

use super::{FrameKind, Kernel};
use crate::engine::{Time, VcpuMask};
use crate::hw::wire::Frame;
use std::collections::VecDeque;

/// Linux's CALL_FUNCTION_SINGLE_VECTOR: the IPI
/// `smp_call_function_single_async` sends.
pub const CALL_FUNCTION_SINGLE_VECTOR: u8 = 0xfb;

/// `netdev_max_backlog`'s default: packets a CPU's backlog holds.
pub const NETDEV_MAX_BACKLOG: usize = 1000;

/// The guest's RPS state: the map and every CPU's backlog.
#[derive(Debug)]
pub(super) struct Rps {
    /// The receive queue's `rps_map`: its CPUs in ascending order.
    map: Vec<usize>,
    /// Per CPU: its backlog's `input_pkt_queue`.
    backlog: Vec<VecDeque<Frame>>,
    /// Per CPU (bit): its backlog is scheduled (`NAPI_STATE_SCHED`), from
    /// the enqueue that found it idle until `process_backlog` empties it.
    scheduled: VcpuMask,
}

/// RPS counters of one guest kernel.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct RpsCounters {
    /// Packets queued on a backlog (this CPU's or another's).
    pub steered: u64,
    /// Of those, to another CPU's backlog.
    pub steered_remote: u64,
    /// CALL_FUNCTION_SINGLE IPIs sent (`net_rps_action_and_irq_enable`).
    pub ipis: u64,
    /// CALL_FUNCTION_SINGLE interrupts taken.
    pub call_function_irqs: u64,
    /// Backlog batches: a backlog scheduled, processed and left empty.
    pub batches: u64,
    /// Packets dropped on a full backlog.
    pub drops: u64,
}

/// The flow hash `get_rps_cpu` indexes the map with: a stand-in for
/// `skb_get_hash` (the flow dissector's 4-tuple through jhash with a boot
/// seed), here a fixed mix of the flow id so that runs repeat.
pub fn flow_hash(flow: u16) -> u32 {
    let mut h = u32::from(flow).wrapping_mul(0x9E37_79B1);
    h ^= h >> 15;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^ (h >> 13)
}

impl Rps {
    /// RPS over `map` (CPUs of a guest of `cpus` CPUs; none: off).
    pub(super) fn new(map: &[usize], cpus: usize) -> Option<Self> {
        let mut map: Vec<usize> = map.iter().copied().filter(|&c| c < cpus).collect();
        map.sort_unstable();
        map.dedup();
        if map.is_empty() {
            return None;
        }
        Some(Rps {
            map,
            backlog: (0..cpus).map(|_| VecDeque::with_capacity(256)).collect(),
            scheduled: VcpuMask::EMPTY,
        })
    }

    /// `get_rps_cpu`: the map's entry `reciprocal_scale(hash, len)`.
    pub(super) fn cpu_for(&self, flow: u16) -> usize {
        let i = (u64::from(flow_hash(flow)) * self.map.len() as u64) >> 32;
        self.map[i as usize]
    }
}

impl Kernel {
    /// `netif_receive_skb` of a frame the NAPI poll took from its device:
    /// with RPS the frame goes to the backlog of the CPU its flow hash
    /// picks, and only the driver's share of the per-packet cost (plus the
    /// steering) is this CPU's; without, it is received here. Returns the
    /// poll's work for the frame.
    pub(super) fn rx_deliver(&mut self, f: Frame, now: Time) -> Time {
        self.rx_driver_cost() + self.gro_up(f, now)
    }

    /// The poll's share of a packet's per-packet cost: all of it, or with
    /// RPS the driver's part (the rest runs on the backlog's CPU).
    pub(super) fn rx_driver_cost(&self) -> Time {
        let c = self.cfg.costs;
        if self.rps.is_some() {
            c.rx_per_packet.saturating_sub(c.rx_protocol)
        } else {
            c.rx_per_packet
        }
    }

    /// A packet whose driver work is done goes up the stack
    /// (`netif_receive_skb`, after GRO): received here, or with RPS queued
    /// on the backlog of the CPU its flow hashes to. Returns the rest of
    /// this CPU's work for it.
    pub(super) fn gro_up(&mut self, f: Frame, now: Time) -> Time {
        let Some(rps) = &self.rps else {
            return self.netif_receive(f, now);
        };
        let target = rps.cpu_for(f.flow);
        self.enqueue_to_backlog(target, f);
        self.cfg.costs.rps_enqueue
    }

    /// `enqueue_to_backlog`: queue `f` on CPU `cpu`'s backlog. A backlog
    /// found empty and idle is scheduled: here at once, on another CPU by
    /// an IPI at the end of this NET_RX run (`rps_ipi_queued`).
    fn enqueue_to_backlog(&mut self, cpu: usize, f: Frame) {
        let Some(rps) = &mut self.rps else { return };
        let q = &mut rps.backlog[cpu];
        if q.len() >= NETDEV_MAX_BACKLOG {
            self.rps_counters.drops += 1;
            return;
        }
        if q.is_empty() && !rps.scheduled.contains(cpu) {
            rps.scheduled.insert(cpu);
            if cpu == self.on {
                self.cpus[self.on].backlog_poll = true;
            } else {
                self.cpus[self.on].rps_ipi_list.insert(cpu);
            }
        }
        q.push_back(f);
        self.rps_counters.steered += 1;
        if cpu != self.on {
            self.rps_counters.steered_remote += 1;
        }
    }

    /// `net_rps_action_and_irq_enable`: the CPUs this one queued work for
    /// get their IPIs now.
    pub(super) fn rps_action(&mut self) {
        let list = std::mem::take(&mut self.cpus[self.on].rps_ipi_list);
        if !list.is_empty() {
            self.cpus[self.on].call_ipi_pending |= list;
            self.cpus[self.on].ipis_queued = true;
        }
    }

    /// The CALL_FUNCTION_SINGLE handler (`smp_call_function_single_interrupt`
    /// → `rps_trigger_softirq`): this CPU's backlog goes on its poll list
    /// and NET_RX is raised (it runs on the way out). Returns its work.
    pub(super) fn call_function_irq(&mut self) -> Time {
        self.rps_counters.call_function_irqs += 1;
        if self.rps.is_some() {
            self.cpus[self.on].backlog_poll = true;
        }
        self.cfg.costs.call_function_ipi
    }

    /// One step of `process_backlog` on this CPU: the next packet's
    /// protocol processing, up to the weight per poll; the backlog is idle
    /// again once it is empty.
    pub(super) fn backlog_step(&mut self, top: usize, stage: u8, round: u32, now: Time) {
        let c = self.cfg.costs;
        if stage == 0 {
            let on = self.on;
            if round < self.cfg.napi_weight {
                let next = self.rps.as_mut().and_then(|r| r.backlog[on].pop_front());
                if let Some(f) = next {
                    // Counted in rx_packets by the poll that took it.
                    let extra = self.netif_receive(f, now);
                    self.cpus[self.on].frames[top].kind = FrameKind::Backlog { round: round + 1 };
                    self.set_compute(top, c.rx_protocol + extra);
                    return;
                }
            } else {
                // Quota used: net_rx_action polls it again (or ksoftirqd
                // does, once netdev_budget is spent).
                if self.softirq_budget_spent() {
                    return;
                }
                self.cpus[self.on].frames[top].kind = FrameKind::Backlog { round: 0 };
                self.set_compute(top, c.napi_poll_base);
                return;
            }
            // Empty: `napi->state = 0` under the backlog's lock.
            if let Some(r) = &mut self.rps {
                r.scheduled.remove(on);
            }
            self.cpus[self.on].backlog_poll = false;
            self.rps_counters.batches += 1;
            self.set_stage(top, 1, 0);
            return;
        }
        self.rps_action();
        self.cpus[self.on].in_softirq = false;
        self.pop();
        self.raise_softirq();
    }

    /// RPS counters.
    pub fn rps_counters(&self) -> RpsCounters {
        self.rps_counters
    }

    /// Whether RPS is on.
    pub fn rps_enabled(&self) -> bool {
        self.rps.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::wire::Frame;

    fn kernel(cpus: usize, map: &[usize]) -> Kernel {
        let mut cfg = crate::guest::test_config();
        cfg.rps_cpus = map.to_vec();
        Kernel::smp(cfg, cpus)
    }

    #[test]
    fn the_flow_hash_spreads_flows_over_the_map_and_keeps_each_on_one_cpu() {
        let r = Rps::new(&[3, 1, 2, 1], 4).expect("on");
        assert_eq!(r.map, [1, 2, 3]);
        let mut seen = [0u32; 4];
        for flow in 0..3000u16 {
            let c = r.cpu_for(flow);
            assert_eq!(c, r.cpu_for(flow), "deterministic");
            seen[c] += 1;
        }
        assert_eq!(seen[0], 0, "CPU 0 is not in the map");
        for c in 1..4 {
            assert!((800..1200).contains(&seen[c]), "{seen:?}");
        }
        assert!(Rps::new(&[], 4).is_none());
        assert!(Rps::new(&[5], 4).is_none());
    }

    /// Only the enqueue that finds a backlog empty and idle schedules it:
    /// this CPU's at once, another's through the IPI list, which the end of
    /// the NET_RX run turns into IPIs to send.
    #[test]
    fn only_an_idle_backlog_asks_for_an_ipi() {
        let mut k = kernel(4, &[0, 2]);
        let flow_to = |k: &Kernel, cpu: usize| {
            (0..1000u16)
                .find(|&f| k.rps.as_ref().unwrap().cpu_for(f) == cpu)
                .unwrap()
        };
        let (local, remote) = (flow_to(&k, 0), flow_to(&k, 2));
        let f = |flow| Frame::udp(flow, 64, 0, 0);
        k.rx_deliver(f(remote), 0);
        k.rx_deliver(f(remote), 0);
        let cpu2 = VcpuMask::single(2);
        assert_eq!(k.cpus[k.on].rps_ipi_list, cpu2, "one IPI for two packets");
        assert!(!k.cpus[k.on].backlog_poll);
        k.rx_deliver(f(local), 0);
        assert!(
            k.cpus[k.on].backlog_poll,
            "this CPU's backlog is scheduled here"
        );
        assert_eq!(k.cpus[k.on].rps_ipi_list, cpu2);
        k.rps_action();
        assert_eq!(
            (k.cpus[k.on].rps_ipi_list, k.cpus[k.on].call_ipi_pending),
            (VcpuMask::EMPTY, cpu2)
        );
        // Still scheduled on CPU 2: more packets, no new IPI.
        k.cpus[k.on].call_ipi_pending = VcpuMask::EMPTY;
        k.rx_deliver(f(remote), 0);
        k.rps_action();
        assert!(k.cpus[k.on].call_ipi_pending.is_empty());
        let c = k.rps_counters();
        assert_eq!((c.steered, c.steered_remote, c.drops), (4, 3, 0));
        assert_eq!(k.rps.as_ref().unwrap().backlog[2].len(), 3);
    }

    #[test]
    fn a_full_backlog_drops() {
        let mut k = kernel(2, &[1]);
        for _ in 0..NETDEV_MAX_BACKLOG + 5 {
            k.rx_deliver(Frame::udp(7, 64, 0, 0), 0);
        }
        let c = k.rps_counters();
        assert_eq!((c.steered, c.drops), (NETDEV_MAX_BACKLOG as u64, 5));
    }
}
