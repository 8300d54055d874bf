//! A scheme written outside the crate plugs in through the trait alone:
//! here stock KVM plus the VMX-preemption timer (ELI's protection against a
//! guest that keeps interrupts off), built with `World::build_with`. The
//! trait's default hooks are stock KVM, so only the setup differs.

use exitless::calibration::Calibration;
use exitless::hv::kvm;
use exitless::hv::scheme::Scheme;
use exitless::hv::HvCx;
use exitless::scenario::Scenario;
use exitless::world::World;

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
