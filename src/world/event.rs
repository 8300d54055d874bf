//! The events of a run. Small and `Copy`: the queue never allocates per event.

use crate::hw::x86::lapic::DeliveryMode;

/// One scheduled occurrence. (The default only fills the event queue's
/// unused slots.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ev {
    /// A guest CPU's polling idle loop sees need_resched set by a sibling
    /// (no IPI: TIF_POLLING_NRFLAG).
    GuestPoke {
        /// The vCPU.
        vcpu: u16,
    },
    /// A core's work segment finished (stale if `gen` moved on).
    Segment {
        /// Core.
        core: u16,
        /// Segment generation.
        gen: u64,
    },
    /// A vCPU's guest deadline (APIC-timer virtualization) came due.
    GuestDeadline {
        /// The vCPU.
        vcpu: u16,
    },
    /// A LAPIC timer deadline came due.
    LapicTimer {
        /// Core.
        core: u16,
        /// Timer generation.
        gen: u64,
    },
    /// An IPI or remapped interrupt reaches a LAPIC.
    ApicArrive {
        /// Destination core.
        core: u16,
        /// Vector (2 for NMI).
        vector: u8,
        /// Delivery mode.
        mode: DeliveryMode,
    },
    /// A virtualization extension's doorbell reaches a core: it looks at
    /// the running guest's pending virtual interrupts again (AMD's AVIC
    /// doorbell; `world::arch` dispatches it).
    Doorbell {
        /// Destination core.
        core: u16,
    },
    /// An MSI-X write from a device reaches the IOMMU.
    Msi {
        /// IRT handle.
        handle: u16,
        /// Requester id of the device.
        requester_id: u16,
    },
    /// The NIC's internal ITR countdown for a vector expired.
    NicItr {
        /// VF.
        vf: u16,
        /// MSI-X vector of the VF.
        vector: u8,
        /// Countdown generation.
        gen: u64,
    },
    /// A core's VMX-preemption timer reached zero (stale if `gen` moved on).
    PreemptionTimer {
        /// Core.
        core: u16,
        /// Arming generation.
        gen: u64,
    },
    /// A frame finished arriving at the NIC from the wire.
    WireRx {
        /// Target VF.
        vf: u16,
        /// Frame length.
        len: u32,
        /// Send time at the client.
        sent: u64,
        /// Sequence number.
        seq: u64,
    },
    /// The external client host sends its next datagram to a VM.
    ClientTx {
        /// The VM (its VF).
        vm: u16,
    },
    /// The guest's own device-emulation traffic: an I/O instruction (0) or an
    /// EPT violation (1), from the calibrated background source.
    Background {
        /// vCPU.
        vcpu: u16,
        /// 0 = IO_INSTRUCTION, 1 = EPT_VIOLATION.
        kind: u8,
    },
    /// An eventfd was signalled (ioeventfd kick, or a host thread's notify).
    Eventfd {
        /// Eventfd id.
        fd: u16,
    },
    /// A vhost worker thread finished a unit of work, woke up or was
    /// switched in.
    VhostStep {
        /// Worker.
        worker: u16,
    },
    /// A vhost worker's interruptible sleep (ES2) runs out (stale unless
    /// `gen` is its current nap).
    VhostNapEnd {
        /// Worker.
        worker: u16,
        /// Nap generation.
        gen: u64,
    },
    /// A thread of kvm-tools' virtio-net back end finished a unit of work,
    /// woke up or was switched in.
    KvmtoolStep {
        /// Device d's thread of role r is `d * 3 + r`.
        thread: u16,
    },
    /// The bridged host NIC's moderated receive interrupt fires (stale if
    /// it is not the one armed).
    KvmtoolNicIrq,
    /// ksoftirqd runs the bridged host's receive path a softirq left over.
    KvmtoolSoftirqd,
    /// A softirq of the bridged host ended: its frames are on the taps.
    KvmtoolHostRxDone,
    /// A block back end's QEMU thread finished a unit of work or woke up.
    BlkStep {
        /// The virtio-blk device whose back end it is.
        dev: u16,
    },
    /// The next frame from the guest reaches a peer host.
    ToPeer {
        /// Which peer.
        peer: u16,
    },
    /// The next frame from a peer host reaches the guest's side (the tap
    /// device, or the VF).
    ToGuest {
        /// Which peer.
        peer: u16,
    },
    /// The VF's head TX frame has left the wire.
    VfTxDone {
        /// VF.
        vf: u16,
        /// Its TX queue.
        queue: u8,
    },
    /// A peer process's timer (stale unless `key` is the one its owner
    /// armed last).
    PeerTimer {
        /// Which peer.
        peer: u16,
        /// The tie-break key it was queued with.
        key: u64,
    },
    /// A peer process's thread on this host finished the work planned on
    /// it (stale unless `gen` is its current step).
    PeerThreadStep {
        /// Which peer.
        peer: u16,
        /// Which of its CPUs (threads).
        cpu: u16,
        /// Step generation.
        gen: u32,
    },
    /// End of warm-up: statistics restart.
    #[default]
    WarmupEnd,
    /// The host sends an IPI to a VM's core (Poisson source).
    HostIpi {
        /// Destination core.
        core: u16,
    },
    /// The host deschedules a vCPU (schedule-out).
    Deschedule {
        /// vCPU.
        vcpu: u16,
    },
    /// The host schedules the vCPU back in.
    Reschedule {
        /// vCPU.
        vcpu: u16,
    },
    /// The host scheduler's tick on a core (CFS slice check).
    SchedTick {
        /// Core.
        core: u16,
    },
    /// A halted vCPU was kicked: its thread wakes.
    WakeVcpu {
        /// vCPU.
        vcpu: u16,
    },
    /// The host scheduler switches threads on a core (a woken thread's
    /// wake-up preemption, after its wake-up latency).
    Resched {
        /// Core.
        core: u16,
    },
    /// The vCanal service core finished a work item.
    CanalStep,
    /// The vhost-vsock worker's core finished a work item (virtio-vsock).
    VsockStep,
    /// The head frame from the relay's host reaches the client host.
    VsockToPeer,
    /// The head frame from the client host reaches the relay's host NIC.
    VsockToHost,
    /// The vsock client host's timer.
    VsockPeerTimer,
    /// A deadline of the vsock relay's TCP socket came.
    VsockTcpTimer,
    /// The head frame from the host NIC reaches the client host (vCanal).
    CanalToPeer,
    /// The head frame from the client host reaches the host NIC (vCanal).
    CanalToHost,
    /// The vCanal host NIC's moderated receive interrupt fires (stale if
    /// it is not the one armed).
    CanalNicIrq,
    /// A vCanal network-pool thread's work item ended, or it was switched
    /// in.
    CanalPoolStep { thread: u16 },
    /// ksoftirqd runs the host receive path a softirq left over (vCanal).
    CanalSoftirqd,
    /// A vCanal VM's client host's timer.
    CanalPeerTimer {
        /// The VM.
        vm: u16,
    },
    /// A halted vCPU's polling window ran out (stale if `gen` moved on).
    HaltPollEnd {
        /// vCPU.
        vcpu: u16,
        /// Polling generation.
        gen: u64,
    },
    /// ARM: a core's virtual timer reached its compare value (stale if
    /// `gen` moved on).
    VtimerFire {
        /// Core.
        core: u16,
        /// Timer generation.
        gen: u64,
    },
    /// ARM: a device's MSI write reaches the ITS (GITS_TRANSLATER).
    ItsMsi {
        /// DeviceID.
        device: u16,
        /// EventID.
        event: u16,
    },
    /// ARM GICv4.1: a GITS_SGIR write reaches the ITS, which sends the
    /// vSGI it names to its vPE where the vPE table says it is.
    ItsSgir {
        /// The value written (vPEID \[47:32\], vINTID \[3:0\]).
        value: u64,
        /// Why it was sent (`hv::arm::EventClass` index), for the
        /// exits-per-event accounting of a doorbell it rings.
        class: u8,
    },
    /// ARM: a physical SGI reaches a core's redistributor.
    ArmSgi {
        /// Target core.
        core: u16,
        /// INTID (0-15).
        intid: u8,
        /// Why it was sent (`hv::arm::EventClass` index), for the
        /// exits-per-event accounting.
        class: u8,
    },
    /// ARM: KVM's background timer of a blocked vCPU (`bg_timer`) fired
    /// (stale if `gen` moved on).
    BgTimer {
        /// vCPU.
        vcpu: u16,
        /// Arming generation.
        gen: u64,
    },
    /// ARM: kvm_vcpu_halt's polling window for a vCPU ran out (stale if
    /// `gen` moved on).
    ArmPollEnd {
        /// vCPU.
        vcpu: u16,
        /// Polling generation.
        gen: u64,
    },
    /// RISC-V: a hart's `time` reached the `vstimecmp` it holds (stale if
    /// `gen` moved on).
    HsVsTimer {
        /// Hart.
        core: u16,
        /// Arming generation.
        gen: u64,
    },
    /// RISC-V: KVM's hrtimer of a vCPU fired (the SBI timer's deadline, or
    /// a blocked vCPU's `vstimecmp`; stale if `gen` moved on).
    HsKvmTimer {
        /// vCPU.
        vcpu: u16,
        /// Arming generation.
        gen: u64,
    },
    /// RISC-V: the host's IPI (a kick) reaches a hart's S file.
    HsHostIpi {
        /// Hart.
        core: u16,
    },
    /// RISC-V: a VF's MSI write reaches the IOMMU's MSI translation.
    HsMsi {
        /// VF.
        vf: u16,
        /// Its MSI-X vector.
        vector: u8,
    },
    /// RISC-V: a store into an interrupt file has reached it; the hart it
    /// signals looks again.
    HsPoke {
        /// Hart.
        core: u16,
    },
    /// RISC-V: a blocked vCPU's thread wakes up (after the wake-up
    /// latency).
    HsWake {
        /// vCPU.
        vcpu: u16,
    },
    /// ARM: a blocked vCPU's thread wakes up (kvm_vcpu_wake_up, after the
    /// wake-up latency).
    ArmWake {
        /// vCPU.
        vcpu: u16,
    },
    /// ARM: a core that was in an idle state (a board's cpuidle state,
    /// entered by an untrapped WFI) is awake after the state's exit
    /// latency and takes what is pending.
    ArmIdleExit {
        /// Core.
        core: u16,
    },
    /// ARM: VM `vm`'s NIC on a wired SPI. `assert`: its line, driven
    /// high by the device, reaches the distributor (ignored if the driver
    /// masked the device meanwhile); otherwise the SPI was deactivated
    /// while its line is still high, and its target core looks again.
    NicSpi {
        /// The VM whose NIC (its SPI is `intids::nic_spi(vm)`).
        vm: u16,
        /// The line rises (or only a look again).
        assert: bool,
    },
}

use crate::engine::{EventQueue, Time};
use crate::hw::x86::lapic::{ApicEffect, IpiDest};
use crate::hw::x86::Machine;

/// Turns what a LAPIC register write asked for into events: an IPI travels
/// to its destination LAPIC(s) (`timing.latency` for remote cores, at most
/// `timing.max` in a perturbed run; at once for
/// self), a (re)armed timer gets its expiry event. Returns the EOI result, if
/// the write was an EOI.
pub fn schedule_apic_effect(
    q: &mut EventQueue<Ev>,
    m: &Machine,
    core: usize,
    eff: ApicEffect,
    timing: crate::hv::IpiTiming,
) -> Option<Option<u8>> {
    match eff {
        ApicEffect::Eoi(c) => return Some(c),
        ApicEffect::TimerArmed { deadline, gen } => q.schedule(
            deadline,
            Ev::LapicTimer {
                core: core as u16,
                gen,
            },
        ),
        ApicEffect::SendIpi(ipi) => {
            // A remote IPI is a message in flight (its latency varies in
            // a perturbed run); a self-IPI is not.
            let send = |q: &mut EventQueue<Ev>, dest: usize, lat: Time| {
                let ev = Ev::ApicArrive {
                    core: dest as u16,
                    vector: ipi.vector,
                    mode: ipi.mode,
                };
                if lat > 0 {
                    q.schedule_in_async_within(lat, timing.max, ev)
                } else {
                    q.schedule_in(0, ev)
                }
            };
            match ipi.dest {
                IpiDest::SelfOnly => send(q, core, 0),
                IpiDest::Physical(id) => {
                    if let Some(d) = m.core_of_apic(id) {
                        send(q, d, if d == core { 0 } else { timing.latency });
                    }
                }
                IpiDest::AllIncludingSelf | IpiDest::AllExcludingSelf => {
                    for d in 0..m.cores.len() {
                        if d == core && ipi.dest == IpiDest::AllExcludingSelf {
                            continue;
                        }
                        send(q, d, if d == core { 0 } else { timing.latency });
                    }
                }
            }
        }
        ApicEffect::TimerStopped | ApicEffect::None => {}
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::x86::lapic::{msr, ApicClocks, DeliveryMode};
    use crate::hw::x86::nic::{Link, Nic, NicConfig};

    /// Every `ApicArrive` the queue holds, as (core, vector, mode), by core.
    fn arrivals(q: &mut EventQueue<Ev>) -> Vec<(u16, u8, DeliveryMode)> {
        let mut out = Vec::new();
        while let Some((_, ev)) = q.pop_until(Time::MAX) {
            if let Ev::ApicArrive { core, vector, mode } = ev {
                out.push((core, vector, mode));
            }
        }
        out.sort_by_key(|a| a.0);
        out
    }

    fn machine(cores: usize) -> Machine {
        let clocks = ApicClocks {
            bus_period_ps: 10_000,
            tsc_hz: 2_000_000_000,
        };
        let nic = Nic::new(NicConfig::default(), &[0x0110]).expect("default NIC builds");
        Machine::new(cores, 1, clocks, nic, Link::default())
    }

    /// An x2APIC physical-mode IPI to FFFF_FFFFH is a broadcast (SDM
    /// 10.6.2.1, 10.12.9): every core receives it, the sender included, as
    /// kvm-unit-tests' "APIC physical broadcast address" checks.
    #[test]
    fn physical_broadcast_destination_reaches_every_core() {
        let mut m = machine(4);
        let mut q = EventQueue::with_capacity(8);
        for (dm, vector, mode) in [
            (0u64, 0x40u8, DeliveryMode::Fixed),
            (4, 2, DeliveryMode::Nmi),
        ] {
            let icr = (0xFFFF_FFFFu64 << 32) | (dm << 8) | u64::from(vector);
            let eff = m.lapics[2].write_msr(msr::ICR, icr, 0).expect("valid ICR");
            schedule_apic_effect(
                &mut q,
                &m,
                2,
                eff,
                crate::hv::IpiTiming {
                    latency: 1_000,
                    max: 1_000,
                },
            );
            let got = arrivals(&mut q);
            let want: Vec<_> = (0..4u16).map(|c| (c, vector, mode)).collect();
            assert_eq!(got, want, "ICR {icr:#x}");
        }
    }

    /// The shorthands route as their names say; an unknown physical id
    /// reaches nobody.
    #[test]
    fn shorthands_and_physical_ids_route_to_their_cores() {
        let mut m = machine(4);
        let mut q = EventQueue::with_capacity(8);
        let cases: [(u64, &[u16]); 5] = [
            ((3 << 32) | 0x41, &[3]),
            ((1 << 18) | 0x41, &[1]),
            ((2 << 18) | 0x41, &[0, 1, 2, 3]),
            ((3 << 18) | 0x41, &[0, 2, 3]),
            ((9 << 32) | 0x41, &[]),
        ];
        for (icr, cores) in cases {
            let eff = m.lapics[1].write_msr(msr::ICR, icr, 0).expect("valid ICR");
            schedule_apic_effect(
                &mut q,
                &m,
                1,
                eff,
                crate::hv::IpiTiming {
                    latency: 1_000,
                    max: 1_000,
                },
            );
            let got: Vec<u16> = arrivals(&mut q).iter().map(|a| a.0).collect();
            assert_eq!(got, cores, "ICR {icr:#x}");
        }
    }
}
