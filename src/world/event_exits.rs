//! Exits per guest event (did-arm.md §3's table), for every architecture:
//! the guest events of each class (programs its timer, takes a timer
//! expiry, ends an interrupt, a device interrupt, an IPI from a sibling
//! vCPU or from the host, idles) and the exits the hardware charged to
//! each. ARM worlds always keep it; x86 ones when the scenario asks
//! (`report.exits_per_event`), so other x86 reports keep their keys.

use crate::guest::app::Metrics;
use crate::hv::exits::EventClass;

const CLASSES: usize = EventClass::ALL.len();

/// Per VM: events and exits by class.
#[derive(Clone, Debug)]
pub(super) struct EventExits {
    events: Vec<[u64; CLASSES]>,
    exits: Vec<[u64; CLASSES]>,
    measuring: bool,
    /// Per core: why the last reschedule IPI or kick SGI was sent to it.
    pub(super) kick: Vec<EventClass>,
}

/// The event a guest kernel operation is.
pub(super) fn op_class(op: &crate::guest::KernelOp) -> Option<EventClass> {
    use crate::guest::KernelOp;
    match op {
        KernelOp::ProgramClockevent { .. } => Some(EventClass::TimerProgram),
        KernelOp::EndOfInterrupt { .. } => Some(EventClass::Eoi),
        KernelOp::SendIpi { .. } | KernelOp::PostedIpi { .. } => Some(EventClass::VcpuIpi),
        KernelOp::Idle => Some(EventClass::Idle),
        _ => None,
    }
}

impl EventExits {
    pub(super) fn new(vms: usize, cores: usize) -> Self {
        EventExits {
            events: vec![[0; CLASSES]; vms],
            exits: vec![[0; CLASSES]; vms],
            measuring: false,
            kick: vec![EventClass::Other; cores],
        }
    }

    /// A guest event of `vm`.
    pub(super) fn event(&mut self, vm: usize, class: EventClass) {
        if self.measuring {
            self.events[vm][class.index()] += 1;
        }
    }

    /// An exit of `vm` charged to `class`.
    pub(super) fn exit(&mut self, vm: usize, class: EventClass) {
        if self.measuring {
            self.exits[vm][class.index()] += 1;
        }
    }

    /// The measured interval starts.
    pub(super) fn reset(&mut self) {
        self.events.iter_mut().for_each(|e| *e = [0; CLASSES]);
        self.exits.iter_mut().for_each(|e| *e = [0; CLASSES]);
        self.measuring = true;
    }

    /// `events.<class>`, `exits_by_event.<class>` and, where events
    /// happened, `exits_per_event.<class>` (VM 0's by their plain names).
    pub(super) fn metrics(&self, out: &mut Metrics) {
        for vm in 0..self.events.len() {
            let p = crate::report::vm_prefix(vm);
            for c in EventClass::ALL {
                let (e, x) = (self.events[vm][c.index()], self.exits[vm][c.index()]);
                out.insert(format!("{p}events.{}", c.key()), e as f64);
                out.insert(format!("{p}exits_by_event.{}", c.key()), x as f64);
                if e > 0 {
                    out.insert(
                        format!("{p}exits_per_event.{}", c.key()),
                        x as f64 / e as f64,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_in_the_measured_interval_and_divides_per_class() {
        let mut e = EventExits::new(2, 1);
        e.event(0, EventClass::Eoi);
        e.exit(0, EventClass::Eoi);
        e.reset();
        for _ in 0..4 {
            e.event(1, EventClass::VcpuIpi);
        }
        for _ in 0..8 {
            e.exit(1, EventClass::VcpuIpi);
        }
        e.event(0, EventClass::Idle);
        let mut m = Metrics::new();
        e.metrics(&mut m);
        assert_eq!(m["vm1.exits_per_event.vcpu_ipi"], 2.0);
        assert_eq!(m["exits_per_event.idle"], 0.0);
        assert_eq!(m["events.eoi"], 0.0);
        assert!(!m.contains_key("exits_per_event.eoi"));
    }
}
