//! No hypervisor: the guest kernel runs natively on its core, owns the LAPIC
//! and programs the IRT for its NIC function itself.

use crate::hv::exits::ExitInfo;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::lapic::{ApicBitmap, DeliveryMode};

/// The `bare-metal` scheme.
pub struct BareMetal;

impl Scheme for BareMetal {
    fn name(&self) -> &'static str {
        "bare-metal"
    }

    fn virtualized(&self) -> bool {
        false
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        // The native OS's IRQ setup: its own vector, aimed at its core.
        let Some(a) = cx.hv.vms[vm].vf else { return };
        if a.queues <= 1 {
            let core = cx.hv.vcpus[cx.hv.device_home(vm)].core;
            let irte = a.irte(
                cx.m.cores[core].apic_id,
                a.guest_vector,
                DeliveryMode::Fixed,
            );
            cx.irt_update(a.irte, irte);
            return;
        }
        // ixgbe with RSS: one vector per queue pair, vector q's affinity
        // CPU q (the hint `ixgbe_request_msix_irqs` sets, applied as
        // irqbalance's exact hint policy or Intel's set_irq_affinity
        // script does).
        for q in 0..a.queues {
            let cpus = &cx.hv.vms[vm].vcpus;
            let cpu = cpus[usize::from(q) % cpus.len()];
            let core = cx.hv.vcpus[cpu].core;
            let irte = a.irte(
                cx.m.cores[core].apic_id,
                a.queue_vector(q),
                DeliveryMode::Fixed,
            );
            cx.irt_update(a.queue_irte(q), irte);
        }
    }

    fn handle_exit(&mut self, _cx: &mut HvCx, _vcpu: usize, _info: ExitInfo) -> ExitOutcome {
        ExitOutcome::default()
    }

    fn virtual_interrupt(&mut self, _cx: &mut HvCx, _vcpu: usize, _vector: u8) {}

    fn prepare_entry(&mut self, _cx: &mut HvCx, _vcpu: usize) {}

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        cx.m.lapics[cx.hv.vcpus[vcpu].core].isr
    }
}
