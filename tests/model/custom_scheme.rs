//! A scheme written outside the crate plugs in through the trait alone:
//! here stock KVM plus the VMX-preemption timer (ELI's protection against a
//! guest that keeps interrupts off), built with `World::build_with`. The
//! trait's default hooks are stock KVM, so only the setup differs.

use exitless::calibration::Calibration;
use exitless::hv::exits::{ExitInfo, ExitReason};
use exitless::hv::kvm;
use exitless::hv::scheme::{ExitOutcome, Scheme};
use exitless::hv::HvCx;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::cell::Cell;
use std::rc::Rc;

struct KvmWithPreemptionTimer {
    value: u32,
}

impl Scheme for KvmWithPreemptionTimer {
    fn name(&self) -> &'static str {
        "kvm+ptimer"
    }
    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        kvm::setup(cx, vm);
        for &v in &cx.hv.vms[vm].vcpus.clone() {
            cx.m.vmcs[v].pin.preemption_timer = true;
            cx.m.vmcs[v].preemption_timer_value = self.value;
        }
    }
}

#[test]
fn preemption_timer_exits_at_its_programmed_period() {
    let s = Scenario::parse(
        "scheme = \"kvm\"\nduration_s = 0.1\n[background]\nenabled = false\n[guest]\ntick = \"off\"\n",
        &[],
    )
    .unwrap();
    // 3.4 GHz TSC, rate 5: 10,625 timer ticks = 100 µs, restarted at every
    // entry (as KVM programs it), so the host's 1 ms tick exit resets it.
    let mut w = World::build_with(
        &s,
        &Calibration::default_host(),
        Box::new(KvmWithPreemptionTimer { value: 10_625 }),
    )
    .unwrap();
    w.run(|_| {});
    let r = w.report();
    assert_eq!(r.scheme, "kvm+ptimer");
    let rate = r.vms[0]
        .exits_per_s_by_reason
        .get("PREEMPTION_TIMER")
        .copied()
        .unwrap_or(0.0);
    // Nine 100 µs periods fit between two host ticks.
    assert!(
        (8000.0..=10_000.0).contains(&rate),
        "{rate} preemption-timer exits/s for a 100 µs timer"
    );
    let tick = r.vms[0]
        .exits_per_s_by_reason
        .get("EXTERNAL_INTERRUPT")
        .copied()
        .unwrap_or(0.0);
    assert!((990.0..=1010.0).contains(&tick), "host tick {tick}/s");
    assert_eq!(r.violations(), 0);
}

/// Stock KVM with the VM-exit control "acknowledge interrupt on exit" set
/// as given, counting what the physical LAPIC holds when the
/// EXTERNAL_INTERRUPT handler starts.
struct KvmAckOnExit {
    ack: bool,
    /// EXTERNAL_INTERRUPT exits handled.
    exits: Rc<Cell<u64>>,
    /// Of those, how many found the interrupt still requested (IRR) and
    /// nothing in service (ISR empty) when the handler started.
    still_pending: Rc<Cell<u64>>,
}

impl Scheme for KvmAckOnExit {
    fn name(&self) -> &'static str {
        "kvm-ack-on-exit"
    }
    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        kvm::setup(cx, vm);
        for &v in &cx.hv.vms[vm].vcpus.clone() {
            cx.m.vmcs[v].exit.ack_interrupt_on_exit = self.ack;
        }
    }
    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        if info.reason() == ExitReason::EXTERNAL_INTERRUPT {
            let lapic = &cx.m.lapics[cx.hv.vcpus[vcpu].core];
            self.exits.set(self.exits.get() + 1);
            if !lapic.irr.is_empty() && lapic.isr.is_empty() {
                self.still_pending.set(self.still_pending.get() + 1);
            }
        }
        kvm::exit(self, cx, vcpu, info)
    }
}

/// SDM 24.7.1 / 27.2.2: with "acknowledge interrupt on exit" the processor
/// acknowledges the LAPIC as it exits (the vector is in service when the
/// handler runs); without it the interrupt stays requested in the IRR and
/// the host takes it once it enables interrupts. Either way the host's 1 ms
/// tick keeps being handled.
#[test]
fn external_interrupt_exit_follows_acknowledge_interrupt_on_exit() {
    let s = Scenario::parse(
        "scheme = \"kvm\"\nduration_s = 0.05\n[background]\nenabled = false\n[guest]\ntick = \"off\"\n",
        &[],
    )
    .unwrap();
    for ack in [true, false] {
        let exits = Rc::new(Cell::new(0));
        let still_pending = Rc::new(Cell::new(0));
        let scheme = KvmAckOnExit {
            ack,
            exits: exits.clone(),
            still_pending: still_pending.clone(),
        };
        let mut w = World::build_with(&s, &Calibration::default_host(), Box::new(scheme)).unwrap();
        w.run(|_| {});
        let r = w.report();
        assert!(exits.get() > 40, "ack={ack}: {} exits", exits.get());
        let want = if ack { 0 } else { exits.get() };
        assert_eq!(still_pending.get(), want, "ack={ack}");
        let tick = r.vms[0]
            .exits_per_s_by_reason
            .get("EXTERNAL_INTERRUPT")
            .copied()
            .unwrap_or(0.0);
        assert!(
            (990.0..=1010.0).contains(&tick),
            "ack={ack}: host tick {tick}/s"
        );
        assert_eq!(r.violations(), 0, "ack={ack}");
    }
}
