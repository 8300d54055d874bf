//! KVM's emulated LAPIC (`arch/x86/kvm/lapic.c` in spirit): the register file
//! lives in hypervisor memory, trapped APIC writes are emulated on it, its
//! timer is an hrtimer on the host, and pending vectors are injected through
//! the VMCS at VM entry (`inject_pending_event`).

use crate::hv::host::HostTimer;
use crate::hv::HvCx;
use crate::hw::x86::lapic::{ApicClocks, ApicEffect, Ipi, Lapic, TimerModeChange};
use crate::hw::x86::vmcs::EntryEvent;

/// A vCPU's emulated LAPIC (`kvm_create_lapic`): the register file of the
/// processor's LAPIC, except that an LVT Timer mode change follows KVM's
/// `apic_update_lvtt` rather than SDM 10.5.4.1. KVM keeps a one-shot or
/// periodic countdown running across a switch between the two (its hrtimer
/// is not cancelled; the new mode decides at expiry) and cancels the timer,
/// zeroing TMICT, only on a switch into or out of TSC-deadline mode.
pub fn new(clocks: ApicClocks) -> Lapic {
    Lapic::new(0, clocks).with_timer_mode_change(TimerModeChange::KeepUnlessTscDeadline)
}

/// Emulates a trapped x2APIC register write on `vcpu`'s emulated LAPIC.
/// Returns the EOI result for EOI writes.
pub fn emulate_write(cx: &mut HvCx, vcpu: usize, reg: u32, value: u64) -> Option<Option<u8>> {
    let now = cx.now;
    let eff = match cx.hv.vcpus[vcpu].vlapic.write_msr(reg, value, now) {
        Ok(e) => e,
        // A bad write would #GP the guest; the model's guest never does it.
        Err(_) => return None,
    };
    match eff {
        ApicEffect::Eoi(c) => return Some(c),
        ApicEffect::TimerArmed { deadline, gen } => {
            // start_apic_timer: an hrtimer on the vCPU's current core.
            let core = cx.hv.vcpus[vcpu].core;
            cx.host_timer_cancel(
                vcpu,
                |t| matches!(t, HostTimer::GuestTimer { vcpu: v, .. } if *v == vcpu),
            );
            cx.host_timer_start(core, deadline, HostTimer::GuestTimer { vcpu, gen });
        }
        ApicEffect::TimerStopped => {
            cx.host_timer_cancel(
                vcpu,
                |t| matches!(t, HostTimer::GuestTimer { vcpu: v, .. } if *v == vcpu),
            );
        }
        // ICR writes go through emulate_icr.
        ApicEffect::SendIpi(_) | ApicEffect::None => {}
    }
    None
}

/// Emulates a trapped ICR (or SELF IPI) write `reg` on `vcpu`'s emulated
/// LAPIC: the IPI it asks for, if the write is valid (the caller delivers
/// it to the targets).
pub fn emulate_icr(cx: &mut HvCx, vcpu: usize, reg: u32, value: u64) -> Option<Ipi> {
    match cx.hv.vcpus[vcpu].vlapic.write_msr(reg, value, cx.now) {
        Ok(ApicEffect::SendIpi(ipi)) => Some(ipi),
        _ => None,
    }
}

/// The emulated timer's hrtimer fired: latch the timer vector in the
/// emulated IRR (`kvm_apic_local_deliver(LVTT)`); re-arm a periodic timer.
/// Returns the vector when one was latched.
pub fn timer_fired(cx: &mut HvCx, vcpu: usize, gen: u64) -> Option<u8> {
    let now = cx.now;
    let exp = cx.hv.vcpus[vcpu].vlapic.timer_expired(now, gen)?;
    if let Some((deadline, g)) = exp.rearmed {
        let core = cx.hv.vcpus[vcpu].core;
        cx.hv
            .host
            .add(core, deadline, HostTimer::GuestTimer { vcpu, gen: g });
    }
    // timer_expired already set IRR; report the vector so the scheme can
    // kick or post it.
    exp.vector
}

/// `inject_pending_event`: if the emulated LAPIC has a deliverable vector
/// and the guest is interruptible, move it to ISR and inject it through the
/// VM-entry interruption-information field; if the guest is not
/// interruptible, ask for an interrupt-window exit.
pub fn inject_pending(cx: &mut HvCx, vcpu: usize) {
    let vmcs = &mut cx.m.vmcs[vcpu];
    if vmcs.entry_event.is_some() {
        return;
    }
    let deliverable = cx.hv.vcpus[vcpu].vlapic.deliverable();
    match deliverable {
        Some(_) if cx.guest_if(vcpu) => {
            if let Some(v) = cx.hv.vcpus[vcpu].vlapic.ack() {
                let vmcs = &mut cx.m.vmcs[vcpu];
                vmcs.entry_event = Some(EntryEvent::ExternalInterrupt(v));
                vmcs.proc.interrupt_window_exiting = false;
            }
        }
        Some(_) => cx.m.vmcs[vcpu].proc.interrupt_window_exiting = true,
        None => cx.m.vmcs[vcpu].proc.interrupt_window_exiting = false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::x86::lapic::msr;

    /// The emulated LAPIC is KVM's: a one-shot -> periodic switch leaves
    /// the armed countdown alone (no hrtimer cancel), where the processor's
    /// LAPIC would disarm it.
    #[test]
    fn emulated_lapic_keeps_the_countdown_on_a_one_shot_periodic_switch() {
        let clocks = ApicClocks {
            bus_period_ps: 10_000,
            tsc_hz: 2_000_000_000,
        };
        let mut v = new(clocks);
        v.write_msr(msr::LVT_TIMER, 0x30, 0).ok();
        let Ok(ApicEffect::TimerArmed { deadline, .. }) = v.write_msr(msr::TMICT, 100, 0) else {
            panic!("not armed");
        };
        assert_eq!(
            v.write_msr(msr::LVT_TIMER, 0x30 | (1 << 17), 1),
            Ok(ApicEffect::None)
        );
        assert_eq!(v.timer_deadline(), Some(deadline));
        let mut hw = Lapic::new(0, clocks);
        hw.write_msr(msr::LVT_TIMER, 0x30, 0).ok();
        hw.write_msr(msr::TMICT, 100, 0).ok();
        assert_eq!(
            hw.write_msr(msr::LVT_TIMER, 0x30 | (1 << 17), 1),
            Ok(ApicEffect::TimerStopped)
        );
    }
}
