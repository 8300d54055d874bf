//! `kvm-2026`: KVM as users run it today — APICv with VT-d posted
//! interrupts for assigned devices, plus the mechanisms added since the
//! 2012–2015 papers, each switchable in `[hv]`:
//!
//! * **Posted timer interrupts** (`hv.posted_timers`): the guest's LAPIC
//!   timer is an hrtimer on a housekeeping core, and its expiry is posted
//!   to the vCPU's descriptor with a notification IPI, so it no longer
//!   lands as an external-interrupt exit on the vCPU's core. Programming
//!   the timer still exits (the MSR write is trapped).
//! * **Halt polling** (`hv.halt_poll`, `hv.halt_poll_max_us`): on a HLT
//!   with nothing pending, the vCPU thread spins up to its window before
//!   sleeping; the window starts at 0, grows (×2, from 10 µs) after a halt
//!   shorter than the cap, and resets to 0 after a longer one (upstream
//!   `kvm_vcpu_halt`, `grow_halt_poll_ns` / `shrink_halt_poll_ns` with
//!   `halt_poll_ns_shrink = 0`; x86 cap `KVM_HALT_POLL_NS_DEFAULT` =
//!   200 µs).
//! * **IPI virtualization** (`hv.ipiv`): unicast fixed physical-mode ICR
//!   writes of SMP guests post to the target's descriptor through the
//!   PID-pointer table, without a sender exit; a halted target's
//!   descriptor notifies the wakeup vector, a preempted one's is
//!   suppressed until its next entry.
//! * **APIC-timer virtualization** (`hv.apic_timer_virt`, off by default:
//!   Intel's ISE 319433-059 ch. 8 hardware with the 2026 KVM series "VMX
//!   APIC timer virtualization support", not yet merged): while the
//!   guest's LVT timer is unmasked in TSC-deadline mode and the vCPU is not
//!   blocked, KVM sets the tertiary control, the virtual timer vector and
//!   drops the TSC_DEADLINE write intercept, so the guest's deadline writes
//!   and the timer's expiry take no exit (`vmx_set_apic_virt_timer`).
//!   Otherwise it falls back to its software timer: one-shot or periodic
//!   mode and a masked LVTT (`vmx_can_use_apic_virt_timer`, and the cover
//!   letter's "masked" case), and a vCPU that blocks: the hardware fires
//!   only in non-root operation, so before the thread sleeps KVM reads the
//!   guest deadline back into an hrtimer, and after it wakes moves it back
//!   (patch "x86/lapic: Start/stop sw/hv timer on vCPU un/block").
//! * **PV EOI** is not used: KVM turns it off when APICv virtualizes EOI.

use super::apicv::Apicv;
use super::vlapic;
use crate::engine::{Time, NS, US};
use crate::hv::exits::ExitInfo;
use crate::hv::host::HostTimer;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::lapic::{msr, TimerMode};

/// `halt_poll_ns_grow_start`: the first window after a short halt.
const HALT_POLL_GROW_START: Time = 10 * US;
/// `halt_poll_ns_grow`.
const HALT_POLL_GROW: u64 = 2;

/// `[hv]` options of `kvm-2026`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Kvm2026Options {
    /// Posted timer interrupts from a housekeeping core.
    pub posted_timers: bool,
    /// Halt polling.
    pub halt_poll: bool,
    /// Cap of the halt-polling window, µs (`halt_poll_ns` / 1000).
    pub halt_poll_max_us: f64,
    /// IPI virtualization.
    pub ipiv: bool,
    /// APIC-timer virtualization (Intel ISE 319433-059 ch. 8).
    pub apic_timer_virt: bool,
}

impl Default for Kvm2026Options {
    fn default() -> Self {
        Kvm2026Options {
            posted_timers: true,
            halt_poll: true,
            halt_poll_max_us: 200.0,
            ipiv: true,
            apic_timer_virt: false,
        }
    }
}

/// The `kvm-2026` scheme.
pub struct Kvm2026 {
    apicv: Apicv,
    opts: Kvm2026Options,
    /// Per vCPU: its current halt-polling window.
    poll_window: Vec<Time>,
    /// Halt-poll windows grown and reset, for reports.
    grows: u64,
    shrinks: u64,
    /// Per vCPU: APIC-timer virtualization is on (the tertiary control).
    virt_timer: Vec<bool>,
    /// Per vCPU: blocked (halted, its thread asleep).
    blocked: Vec<bool>,
    /// Switches to the hardware timer and back to the software one.
    virt_timer_on: u64,
    virt_timer_off: u64,
}

impl Kvm2026 {
    /// `kvm-2026` with `opts`; VT-d posted interrupts are always on.
    pub fn new(opts: Kvm2026Options) -> Self {
        Kvm2026 {
            apicv: Apicv::new(true),
            opts,
            poll_window: Vec::new(),
            grows: 0,
            shrinks: 0,
            virt_timer: Vec::new(),
            blocked: Vec::new(),
            virt_timer_on: 0,
            virt_timer_off: 0,
        }
    }

    /// `vmx_can_use_apic_virt_timer`: the option is on, the emulated LVT
    /// timer is in TSC-deadline mode and unmasked (the hardware supports
    /// only TSC-deadline mode and ignores the mask), and the vCPU is not
    /// blocked (the hardware fires only in non-root operation).
    fn can_use_virt_timer(&self, cx: &HvCx, vcpu: usize) -> bool {
        let l = &cx.hv.vcpus[vcpu].vlapic;
        self.opts.apic_timer_virt
            && l.timer_mode() == TimerMode::TscDeadline
            && !l.timer_masked()
            && !self.blocked[vcpu]
    }

    /// Puts `vcpu`'s guest timer where it belongs now: on the VMCS (APIC-
    /// timer virtualization) or on KVM's software hrtimer, moving an armed
    /// deadline across.
    fn update_virt_timer(&mut self, cx: &mut HvCx, vcpu: usize) {
        let want = self.can_use_virt_timer(cx, vcpu);
        if want == self.virt_timer[vcpu] {
            return;
        }
        self.virt_timer[vcpu] = want;
        let now = cx.now;
        if want {
            self.virt_timer_on += 1;
            // The software timer's deadline, if armed, moves to the VMCS
            // (kvm_lapic's deadline → vmx_set_guest_tsc_deadline_virt), and
            // the hrtimer is cancelled.
            let l = &cx.hv.vcpus[vcpu].vlapic;
            let deadline = if l.timer_deadline().is_some() {
                l.read_msr(msr::TSC_DEADLINE, now).unwrap_or(0)
            } else {
                0
            };
            let vector = l.timer_vector();
            if deadline != 0 {
                vlapic::emulate_write(cx, vcpu, msr::TSC_DEADLINE, 0);
            }
            // vmx_set_apic_virt_timer.
            let vmcs = &mut cx.m.vmcs[vcpu];
            vmcs.virtual_timer_vector = vector;
            let _ = vmcs
                .msr_bitmap
                .set_write_intercept(msr::TSC_DEADLINE, false);
            let _ = vmcs.msr_bitmap.set_read_intercept(msr::TSC_DEADLINE, false);
            vmcs.proc2.apic_timer_virtualization = true;
            vmcs.write_guest_deadline(deadline);
        } else {
            self.virt_timer_off += 1;
            // vmx_cancel_apic_virt_timer, after reading the guest deadline
            // back (vmx_get_guest_tsc_deadline_virt) into the software
            // timer; a deadline already passed fires at once.
            let vmcs = &mut cx.m.vmcs[vcpu];
            let deadline = vmcs.guest_deadline_shadow;
            vmcs.write_guest_deadline(0);
            vmcs.proc2.apic_timer_virtualization = false;
            let _ = vmcs.msr_bitmap.set_write_intercept(msr::TSC_DEADLINE, true);
            let _ = vmcs.msr_bitmap.set_read_intercept(msr::TSC_DEADLINE, true);
            if deadline != 0 {
                vlapic::emulate_write(cx, vcpu, msr::TSC_DEADLINE, deadline);
                self.house_timer(cx, vcpu);
            }
        }
    }

    fn max_poll(&self) -> Time {
        (self.opts.halt_poll_max_us * 1000.0).round() as Time * NS
    }

    /// Posted timers: the vCPU's timer hrtimer lives on the housekeeping
    /// core.
    fn house_timer(&self, cx: &mut HvCx, vcpu: usize) {
        if self.opts.posted_timers {
            let hk = cx.hv.designated_core;
            cx.host_timer_move(
                |t| matches!(t, HostTimer::GuestTimer { vcpu: v, .. } if *v == vcpu),
                hk,
            );
        }
    }
}

impl Scheme for Kvm2026 {
    fn name(&self) -> &'static str {
        "kvm-2026"
    }

    fn vcpu_load(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.apicv.vcpu_load(cx, vcpu)
    }

    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.apicv.vcpu_put(cx, vcpu)
    }

    /// APICv's `pi_pre_block`, and the guest timer back on the software
    /// hrtimer while the vCPU sleeps.
    fn vcpu_blocking(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.apicv.vcpu_blocking(cx, vcpu);
        self.blocked[vcpu] = true;
        self.update_virt_timer(cx, vcpu);
    }

    /// APICv's `pi_post_block`, and the guest timer back on the VMCS.
    fn vcpu_unblocking(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.apicv.vcpu_unblocking(cx, vcpu);
        self.blocked[vcpu] = false;
        self.update_virt_timer(cx, vcpu);
    }

    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        self.apicv.virtual_interrupt(cx, vcpu, vector)
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> crate::hw::x86::lapic::ApicBitmap {
        self.apicv.guest_isr(cx, vcpu)
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        self.apicv.setup_vm(cx, vm);
        self.poll_window.resize(cx.hv.vcpus.len(), 0);
        // APIC-timer virtualization starts off (vmx_tertiary_exec_control
        // clears it at reset): the guest's LVTT write turns it on.
        self.virt_timer.resize(cx.hv.vcpus.len(), false);
        self.blocked.resize(cx.hv.vcpus.len(), false);
        if self.opts.ipiv {
            // vmx_vcpu_after_set_cpuid / the PID-pointer table
            // (`kvm_vmx->pid_table`): one entry per vCPU, indexed by its
            // APIC ID; the ICR write intercept is dropped.
            let pid: Vec<u16> = cx.hv.vms[vm].vcpus.iter().map(|&v| v as u16).collect();
            for &vcpu in &cx.hv.vms[vm].vcpus {
                let vmcs = &mut cx.m.vmcs[vcpu];
                vmcs.proc2.ipi_virtualization = true;
                vmcs.pid_table = pid.clone();
                let _ = vmcs.msr_bitmap.set_write_intercept(msr::ICR, false);
            }
        }
    }

    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        self.apicv.vcpu_has_interrupt(cx, vcpu)
    }

    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        let out = self.apicv.handle_exit(cx, vcpu, info);
        if let ExitInfo::MsrWrite {
            msr: msr::TMICT | msr::LVT_TIMER | msr::TDCR | msr::TSC_DEADLINE,
            ..
        } = info
        {
            self.house_timer(cx, vcpu);
        }
        if let ExitInfo::MsrWrite {
            msr: msr::LVT_TIMER,
            ..
        } = info
        {
            // The LVTT write may switch mode or mask: kvm_lapic_reg_write's
            // apic_update_lvtt → the APIC-timer virtualization hooks.
            self.update_virt_timer(cx, vcpu);
        }
        out
    }

    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        self.apicv.host_interrupt(cx, core, vector)
    }

    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.apicv.prepare_entry(cx, vcpu)
    }

    /// The guest timer's expiry is posted (from the housekeeping core when
    /// posted timers are on); a periodic re-arm stays there.
    fn host_timer(&mut self, cx: &mut HvCx, t: HostTimer) {
        match t {
            HostTimer::GuestTimer { vcpu, gen } => {
                cx.charge(cx.costs.kvm_timer_fn);
                if let Some(v) = vlapic::timer_fired(cx, vcpu, gen) {
                    self.virtual_interrupt(cx, vcpu, v);
                }
                self.house_timer(cx, vcpu);
            }
            HostTimer::Tick { core } => {
                cx.charge(cx.costs.tick_handler);
                let next = cx.now + cx.hv.host.tick_period;
                cx.hv.host.add(core, next, HostTimer::Tick { core });
            }
            HostTimer::ParkedTimer { vcpu, vector } => self.virtual_interrupt(cx, vcpu, vector),
        }
    }

    fn halt_poll_window(&self, vcpu: usize) -> Time {
        if self.opts.halt_poll {
            self.poll_window.get(vcpu).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// `kvm_vcpu_halt`'s window update: a halt that ended within the
    /// window keeps it; one longer than the cap resets it; a shorter one
    /// grows it.
    fn halt_ended(&mut self, vcpu: usize, block: Time, _in_poll: bool) {
        if !self.opts.halt_poll {
            return;
        }
        let max = self.max_poll();
        let w = &mut self.poll_window[vcpu];
        if block <= *w {
            return;
        }
        if *w > 0 && block > max {
            *w = 0;
            self.shrinks += 1;
        } else if *w < max && block < max {
            *w = (*w * HALT_POLL_GROW).max(HALT_POLL_GROW_START).min(max);
            self.grows += 1;
        }
    }

    fn reset_metrics(&mut self) {
        self.grows = 0;
        self.shrinks = 0;
        self.virt_timer_on = 0;
        self.virt_timer_off = 0;
    }

    fn metrics(&self, out: &mut crate::guest::app::Metrics) {
        out.insert("kvm2026.halt_poll_grows".into(), self.grows as f64);
        out.insert("kvm2026.halt_poll_shrinks".into(), self.shrinks as f64);
        if self.opts.apic_timer_virt {
            out.insert("kvm2026.virt_timer_on".into(), self.virt_timer_on as f64);
            out.insert("kvm2026.virt_timer_off".into(), self.virt_timer_off as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halt_poll_window_grows_on_short_halts_and_resets_on_long_ones() {
        let mut k = Kvm2026::new(Kvm2026Options::default());
        k.poll_window = vec![0];
        assert_eq!(k.halt_poll_window(0), 0);
        k.halt_ended(0, 30 * US, false);
        assert_eq!(k.halt_poll_window(0), 10 * US);
        k.halt_ended(0, 30 * US, false);
        assert_eq!(k.halt_poll_window(0), 20 * US);
        k.halt_ended(0, 30 * US, false);
        assert_eq!(k.halt_poll_window(0), 40 * US);
        // Woken within the window: kept.
        k.halt_ended(0, 35 * US, true);
        assert_eq!(k.halt_poll_window(0), 40 * US);
        for _ in 0..5 {
            k.halt_ended(0, 190 * US, false);
        }
        assert_eq!(k.halt_poll_window(0), 200 * US, "capped");
        k.halt_ended(0, 5_000 * US, false);
        assert_eq!(k.halt_poll_window(0), 0, "a long halt resets it");
        let off = Kvm2026::new(Kvm2026Options {
            halt_poll: false,
            ..Kvm2026Options::default()
        });
        assert_eq!(off.halt_poll_window(0), 0);
    }
}
