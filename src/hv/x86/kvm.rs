//! Baseline KVM with a software-emulated LAPIC (no APICv): external-interrupt
//! exiting on, every x2APIC write trapped (EOI and TMICT included), virtual
//! interrupts kept in the emulated LAPIC and injected through the VMCS at VM
//! entry, an interrupt-window exit when the guest is not interruptible.
//! These are the [`Scheme`] trait's default hooks; the functions here are
//! what they call, for other schemes to reuse.

use super::vlapic;
use crate::hv::exits::ExitInfo;
use crate::hv::host::RESCHEDULE_VECTOR;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::lapic::{msr as apic_msr, DeliveryMode, IpiDest};
use crate::hw::x86::vmcs::Vmcs;

/// The `kvm` scheme: the trait's default hooks are stock KVM, so this is
/// only the VM setup.
#[derive(Default)]
pub struct Kvm;

/// VMCS and IRT as stock KVM programs them for a VM with an assigned VF.
pub fn setup(cx: &mut HvCx, vm: usize) {
    let xapic = cx.hv.vms[vm].xapic;
    for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
        cx.m.vmcs[vcpu] = Vmcs::kvm_default();
        cx.m.vmcs[vcpu].set_virtual_apic_mode(xapic);
    }
    if let Some(a) = cx.hv.vms[vm].vf {
        // The VF's MSI-X is a host IRQ aimed at the VM's core; its handler
        // injects the guest's vector.
        let core = cx.hv.vcpus[cx.hv.device_home(vm)].core;
        let irte = a.irte(cx.m.cores[core].apic_id, a.host_vector, DeliveryMode::Fixed);
        cx.irt_update(a.irte, irte);
    }
}

/// KVM's `handle_exit` for the reasons the model produces.
pub fn exit<S: Scheme + ?Sized>(
    scheme: &mut S,
    cx: &mut HvCx,
    vcpu: usize,
    info: ExitInfo,
) -> ExitOutcome {
    match info {
        ExitInfo::ExternalInterrupt {
            vector: Some(vector),
        } => {
            let core = cx.hv.vcpus[vcpu].core;
            scheme.host_interrupt(cx, core, vector);
        }
        // Not acknowledged on exit: the host takes it from its LAPIC once
        // it enables interrupts (between exit-handling steps).
        ExitInfo::ExternalInterrupt { vector: None } => {}
        ExitInfo::MsrWrite {
            msr: reg @ (apic_msr::ICR | apic_msr::SELF_IPI),
            value,
        } => {
            // kvm_apic_send_ipi: the emulated ICR decides the targets among
            // the VM's vCPUs; each gets the vector as a virtual interrupt.
            // (SELF IPI is the x2APIC shorthand for a fixed IPI to self.)
            if let Some(ipi) = vlapic::emulate_icr(cx, vcpu, reg, value) {
                // Guest NMIs by IPI are not modelled (the model's guests
                // send fixed reschedule IPIs only).
                if ipi.mode != DeliveryMode::Nmi {
                    let vm = cx.hv.vcpus[vcpu].vm;
                    for i in 0..cx.hv.vms[vm].vcpus.len() {
                        let t = cx.hv.vms[vm].vcpus[i];
                        let hit = match ipi.dest {
                            IpiDest::Physical(id) => id as usize == i,
                            IpiDest::SelfOnly => t == vcpu,
                            IpiDest::AllIncludingSelf => true,
                            IpiDest::AllExcludingSelf => t != vcpu,
                        };
                        if hit {
                            scheme.virtual_interrupt(cx, t, ipi.vector);
                        }
                    }
                }
            }
        }
        ExitInfo::MsrWrite { msr, value } => {
            return ExitOutcome {
                eoi_cleared: vlapic::emulate_write(cx, vcpu, msr, value),
            };
        }
        // An xAPIC guest's LAPIC store: handle_apic_access decodes the
        // instruction and emulates the MMIO write; handle_apic_write
        // emulates the register from the virtual-APIC page. Either way the
        // emulated LAPIC takes it as the x2APIC MSR of the same register.
        // (SMP xAPIC guests, whose ICR is two stores, are not modelled.)
        ExitInfo::ApicAccess { .. } | ExitInfo::ApicWrite { .. } => {
            if let Some((msr, value)) = info.apic_msr() {
                return ExitOutcome {
                    eoi_cleared: vlapic::emulate_write(cx, vcpu, msr, value),
                };
            }
        }
        ExitInfo::Nmi => {
            let core = cx.hv.vcpus[vcpu].core;
            scheme.host_nmi(cx, core);
        }
        // The window is open: prepare_entry injects.
        ExitInfo::PendingInterrupt => cx.m.vmcs[vcpu].proc.interrupt_window_exiting = false,
        // A write to a port with an ioeventfd: kvm_io_bus_write signals the
        // eventfd, which wakes its waiter (a vhost worker).
        ExitInfo::IoInstruction { port } => {
            if let Some(fd) = cx.hv.ioeventfd(cx.hv.vcpus[vcpu].vm, port) {
                cx.q.schedule_in(0, crate::world::event::Ev::Eventfd { fd });
            }
        }
        // kvm_emulate_halt: with nothing pending the vCPU halts and its
        // thread sleeps once the exit is done (kvm_vcpu_block).
        ExitInfo::Hlt => {
            if !scheme.vcpu_has_interrupt(cx, vcpu) {
                cx.hv.vcpus[vcpu].halted = true;
            }
        }
        // EPT fault handling, the EOI-induced exit's ack notifiers
        // (level-triggered only): cost only.
        ExitInfo::EptViolation | ExitInfo::PreemptionTimer | ExitInfo::EoiInduced { .. } => {}
        // Stock KVM traps no exception an interrupt's delivery can raise;
        // a scheme that traps #NP (ELI) handles it in its own hook.
        ExitInfo::Exception { .. } => {}
        // kvm_emulate_hypercall: a number KVM does not know returns
        // -KVM_ENOSYS in RAX.
        ExitInfo::Vmcall { .. } => {}
    }
    ExitOutcome::default()
}

/// `kvm_set_irq` → `kvm_apic_set_irq`: latch in the emulated IRR, and kick
/// the vCPU if it is in guest mode (its core must exit to inject).
pub fn raise(cx: &mut HvCx, vcpu: usize, vector: u8) {
    cx.hv.vcpus[vcpu].vlapic.accept_fixed(vector);
    if cx.in_guest_mode(vcpu) {
        let core = cx.hv.vcpus[vcpu].core;
        let from = cx.hv.designated_core;
        cx.send_ipi(from, core, RESCHEDULE_VECTOR, DeliveryMode::Fixed);
    }
    cx.kick(vcpu);
}

impl Scheme for Kvm {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        setup(cx, vm);
    }
}
