//! The events of a run. Small and `Copy`: the queue never allocates per event.

use crate::hw::x86::lapic::DeliveryMode;

/// One scheduled occurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    /// A core's work segment finished (stale if `gen` moved on).
    Segment {
        /// Core.
        core: u16,
        /// Segment generation.
        gen: u64,
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
    /// The external client host sends its next datagram.
    ClientTx,
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
    /// The vhost worker of a virtio-net device finished a unit of work or
    /// woke up.
    VhostStep {
        /// Device.
        dev: u16,
    },
    /// The block back end's I/O thread finished a request or woke up.
    BlkStep,
    /// The next frame from the guest reaches a peer host.
    ToPeer {
        /// Which peer.
        peer: u8,
    },
    /// The next frame from a peer host reaches the guest's side (the tap
    /// device, or the VF).
    ToGuest {
        /// Which peer.
        peer: u8,
    },
    /// The VF's head TX frame has left the wire.
    VfTxDone {
        /// VF.
        vf: u16,
    },
    /// A peer process's timer (stale if `gen` moved on).
    PeerTimer {
        /// Which peer.
        peer: u8,
        /// Arming generation.
        gen: u64,
    },
    /// End of warm-up: statistics restart.
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
}

use crate::engine::{EventQueue, Time};
use crate::hw::x86::lapic::{ApicEffect, IpiDest};
use crate::hw::x86::Machine;

/// Turns what a LAPIC register write asked for into events: an IPI travels
/// to its destination LAPIC(s) (`ipi_latency` for remote cores, at once for
/// self), a (re)armed timer gets its expiry event. Returns the EOI result, if
/// the write was an EOI.
pub fn schedule_apic_effect(
    q: &mut EventQueue<Ev>,
    m: &Machine,
    core: usize,
    eff: ApicEffect,
    ipi_latency: Time,
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
                    q.schedule_in_async(lat, ev)
                } else {
                    q.schedule_in(0, ev)
                }
            };
            match ipi.dest {
                IpiDest::SelfOnly => send(q, core, 0),
                IpiDest::Physical(id) => {
                    if let Some(d) = m.core_of_apic(id) {
                        send(q, d, if d == core { 0 } else { ipi_latency });
                    }
                }
                IpiDest::AllIncludingSelf | IpiDest::AllExcludingSelf => {
                    for d in 0..m.cores.len() {
                        if d == core && ipi.dest == IpiDest::AllExcludingSelf {
                            continue;
                        }
                        send(q, d, if d == core { 0 } else { ipi_latency });
                    }
                }
            }
        }
        ApicEffect::TimerStopped | ApicEffect::None => {}
    }
    None
}
