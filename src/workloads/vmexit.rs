//! kvm-unit-tests' x86 `vmexit` micro-benchmarks (x86/vmexit.c): a test
//! kernel that runs one operation in a loop on CPU 0 and prints the TSC
//! cycles per iteration, `name cycles`, plus for the self-IPI tests the
//! cycles of the IPI write (`  ipi name cycles`) and of the handler's EOI
//! (`  eoi name cycles`). The model runs the tests that touch the exit and
//! interrupt paths it has, each for `iterations` iterations (the real test
//! doubles its count until 2^30 cycles pass), and reports the same numbers
//! as metrics `vmexit.<name>_cycles`, `vmexit.<name>_ipi_cycles`,
//! `vmexit.<name>_eoi_cycles`.
//!
//! Each test is what x86/vmexit.c's function does, in the guest kernel's
//! arch-neutral operations:
//!
//! * `vmcall`: a hypercall KVM does not know (RAX = 0: -KVM_ENOSYS).
//! * `inl_from_qemu`: an I/O port QEMU emulates in user space (0x1234; the
//!   model's port access is an OUT, which QEMU serves the same way).
//! * `tscdeadline_immed`: the TSC deadline set to now; the model waits for
//!   the interrupt, which the real test takes at its next instruction.
//! * `tscdeadline`: the deadline 3000 cycles ahead, then a spin until the
//!   handler ran.
//! * `self_ipi_sti_nop`, `self_ipi_sti_hlt`, `self_ipi_tpr` and their
//!   `x2apic_` variants: with interrupts off (or TPR 0x0f), a fixed IPI to
//!   self through the ICR (x2APIC: the SELF IPI register), then `sti; nop`,
//!   `sti; hlt`, or TPR 0 and a `nop`.
//! * `ipi`, `ipi_halt`: `on_cpu(1, nop)`: an IPI to CPU 1, whose handler
//!   runs the function, and a spin until it ran; `ipi_halt` then waits 2000
//!   cycles so that CPU 1 is back in HLT before the next IPI.
//!
//! Left out (no such operation or exit in the model): cpuid, wbinvd, invd,
//! mov_from/to_cr8, inl_from_pmtimer and inl_from_kernel / outl_to_kernel
//! (in-kernel PIT/PIC ports), mov_dr, ple_round_robin, the MSR tests
//! (wr_kernel_gs_base, wr_tsx_ctrl_msr, IBRS/IBPB, TSC_ADJUST), the CR0/CR4
//! toggles, the tpr_sti variants and pci-mem / pci-io.

use crate::engine::{Time, SEC};
use crate::guest::app::{App, Metrics, Sys, TaskStep};
use crate::guest::KernelOp;

/// x86/vmexit.c's `IPI_TEST_VECTOR`.
pub const IPI_TEST_VECTOR: u8 = 0xb0;

/// The port `inl_from_qemu` reads (no device behind it: QEMU's
/// unassigned-port handler).
const QEMU_PORT: u16 = 0x1234;

/// One of the modelled tests, by its kvm-unit-tests name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Test {
    Vmcall,
    InlFromQemu,
    TscdeadlineImmed,
    Tscdeadline,
    SelfIpiStiNop,
    SelfIpiStiHlt,
    SelfIpiTpr,
    X2apicSelfIpiStiNop,
    X2apicSelfIpiStiHlt,
    X2apicSelfIpiTpr,
    Ipi,
    IpiHalt,
}

impl Test {
    /// Every modelled test, in x86/vmexit.c's order.
    pub const ALL: [Test; 12] = [
        Test::Vmcall,
        Test::InlFromQemu,
        Test::TscdeadlineImmed,
        Test::Tscdeadline,
        Test::SelfIpiStiNop,
        Test::SelfIpiStiHlt,
        Test::SelfIpiTpr,
        Test::X2apicSelfIpiStiNop,
        Test::X2apicSelfIpiStiHlt,
        Test::X2apicSelfIpiTpr,
        Test::Ipi,
        Test::IpiHalt,
    ];

    /// The name the test prints.
    pub fn name(self) -> &'static str {
        match self {
            Test::Vmcall => "vmcall",
            Test::InlFromQemu => "inl_from_qemu",
            Test::TscdeadlineImmed => "tscdeadline_immed",
            Test::Tscdeadline => "tscdeadline",
            Test::SelfIpiStiNop => "self_ipi_sti_nop",
            Test::SelfIpiStiHlt => "self_ipi_sti_hlt",
            Test::SelfIpiTpr => "self_ipi_tpr",
            Test::X2apicSelfIpiStiNop => "x2apic_self_ipi_sti_nop",
            Test::X2apicSelfIpiStiHlt => "x2apic_self_ipi_sti_hlt",
            Test::X2apicSelfIpiTpr => "x2apic_self_ipi_tpr",
            Test::Ipi => "ipi",
            Test::IpiHalt => "ipi_halt",
        }
    }

    /// Whether it needs a second CPU (`is_smp`).
    pub fn smp(self) -> bool {
        matches!(self, Test::Ipi | Test::IpiHalt)
    }

    fn self_ipi(self) -> bool {
        matches!(
            self,
            Test::SelfIpiStiNop
                | Test::SelfIpiStiHlt
                | Test::SelfIpiTpr
                | Test::X2apicSelfIpiStiNop
                | Test::X2apicSelfIpiStiHlt
                | Test::X2apicSelfIpiTpr
        )
    }
}

/// What one test measured.
#[derive(Clone, Copy, Debug, Default)]
struct Result {
    /// Its loop's time, first iteration's start to the last one's end.
    total: Time,
    /// Time in the IPI write (`tsc_ipi`).
    ipi: Time,
    /// Time in the handler's EOI (`tsc_eoi`).
    eoi: Time,
    /// Iterations completed.
    done: u32,
}

/// The benchmark program on CPU 0.
pub struct Vmexit {
    tests: Vec<Test>,
    iterations: u32,
    tsc_hz: u64,
    /// When it starts (the warm-up's end).
    start: Time,
    /// The guest's timer vector (the TSC-deadline tests' LVTT vector).
    timer_vector: u8,
    /// Whether the guest's LVTT is in TSC-deadline mode (`has_tscdeadline`).
    tsc_deadline: bool,
    /// Whether the VM has a second CPU.
    smp: bool,
    /// Per test of `tests`.
    results: Vec<Result>,
    /// The test running (index into `tests`), its iteration's step, when
    /// the loop began and the step began.
    cur: usize,
    step: u8,
    began: Time,
    mark: Time,
    started: bool,
    /// `x`: handlers run in this iteration (the self-IPI ISR's `x++`, the
    /// timer's, CPU 1's `nop`).
    x: u32,
}

impl Vmexit {
    /// The tests `tests`, `iterations` each, from `start`, on a TSC of
    /// `tsc_hz`; `timer_vector`, `tsc_deadline`: the guest's LVT timer;
    /// `smp`: a second CPU exists.
    pub fn new(
        tests: Vec<Test>,
        iterations: u32,
        tsc_hz: u64,
        start: Time,
        timer_vector: u8,
        tsc_deadline: bool,
        smp: bool,
    ) -> Self {
        let n = tests.len();
        Vmexit {
            tests,
            iterations: iterations.max(1),
            tsc_hz,
            start,
            timer_vector,
            tsc_deadline,
            smp,
            results: vec![Result::default(); n],
            cur: 0,
            step: 0,
            began: 0,
            mark: 0,
            started: false,
            x: 0,
        }
    }

    /// `t` in TSC cycles.
    fn cycles(&self, t: Time) -> u64 {
        (u128::from(t) * u128::from(self.tsc_hz) / SEC as u128) as u64
    }

    /// `c` TSC cycles as time.
    fn time_of(&self, c: u64) -> Time {
        (u128::from(c) * SEC as u128 / u128::from(self.tsc_hz.max(1))) as Time
    }

    /// Whether test `t` runs here (its `valid` check).
    fn valid(&self, t: Test) -> bool {
        match t {
            Test::TscdeadlineImmed | Test::Tscdeadline => self.tsc_deadline,
            t if t.smp() => self.smp,
            _ => true,
        }
    }

    /// The clockevent programmed to fire at `at` (WRMSR IA32_TSC_DEADLINE).
    fn deadline(&self, now: Time, at: Time) -> TaskStep {
        TaskStep::Kernel(KernelOp::ProgramClockevent {
            ticks: 1,
            deadline: Some(at.max(now)),
            vector: self.timer_vector,
        })
    }

    /// The next step of test `t`'s iteration at step `s`; None: the
    /// iteration is over.
    fn iteration(&mut self, t: Test, s: u8, now: Time) -> Option<TaskStep> {
        let self_ipi = |x2: bool| {
            TaskStep::Kernel(if x2 {
                KernelOp::SelfIpi {
                    vector: IPI_TEST_VECTOR,
                }
            } else {
                KernelOp::SendIpi {
                    cpu: 0,
                    vector: IPI_TEST_VECTOR,
                }
            })
        };
        let x2 = matches!(
            t,
            Test::X2apicSelfIpiStiNop | Test::X2apicSelfIpiStiHlt | Test::X2apicSelfIpiTpr
        );
        match (t, s) {
            (Test::Vmcall, 0) => Some(TaskStep::Kernel(KernelOp::Hypercall { nr: 0, arg: 0 })),
            (Test::InlFromQemu, 0) => Some(TaskStep::Kernel(KernelOp::QueueNotify {
                port: QEMU_PORT,
                value: 0,
            })),
            (Test::Vmcall | Test::InlFromQemu, _) => None,
            (Test::TscdeadlineImmed, 0) => Some(self.deadline(now, now)),
            (Test::Tscdeadline, 0) => Some(self.deadline(now, now + self.time_of(3000))),
            (Test::TscdeadlineImmed | Test::Tscdeadline, _) => {
                (self.x == 0).then_some(TaskStep::Spin)
            }
            // cli; self IPI; sti; nop — or sti; hlt.
            (Test::SelfIpiStiNop | Test::SelfIpiStiHlt, 0)
            | (Test::X2apicSelfIpiStiNop | Test::X2apicSelfIpiStiHlt, 0) => Some(TaskStep::Cli),
            (Test::SelfIpiStiNop | Test::SelfIpiStiHlt, 1)
            | (Test::X2apicSelfIpiStiNop | Test::X2apicSelfIpiStiHlt, 1) => {
                self.mark = now;
                Some(self_ipi(x2))
            }
            (Test::SelfIpiStiNop | Test::X2apicSelfIpiStiNop, 2) => {
                self.results[self.cur].ipi += now - self.mark;
                Some(TaskStep::Sti)
            }
            (Test::SelfIpiStiHlt | Test::X2apicSelfIpiStiHlt, 2) => {
                self.results[self.cur].ipi += now - self.mark;
                Some(TaskStep::SafeHalt)
            }
            // TPR 0x0f; self IPI; TPR 0; nop.
            (Test::SelfIpiTpr | Test::X2apicSelfIpiTpr, 0) => {
                Some(TaskStep::Kernel(KernelOp::TaskPriority { value: 0x0f }))
            }
            (Test::SelfIpiTpr | Test::X2apicSelfIpiTpr, 1) => {
                self.mark = now;
                Some(self_ipi(x2))
            }
            (Test::SelfIpiTpr | Test::X2apicSelfIpiTpr, 2) => {
                self.results[self.cur].ipi += now - self.mark;
                Some(TaskStep::Kernel(KernelOp::TaskPriority { value: 0 }))
            }
            (t, _) if t.self_ipi() => (self.x == 0).then_some(TaskStep::Spin),
            // on_cpu(1, nop): the IPI, then a spin until CPU 1 ran it.
            (Test::Ipi | Test::IpiHalt, 0) => {
                self.mark = now;
                Some(TaskStep::Kernel(KernelOp::SendIpi {
                    cpu: 1,
                    vector: IPI_TEST_VECTOR,
                }))
            }
            (Test::Ipi | Test::IpiHalt, 1) => {
                if self.x == 0 {
                    return Some(TaskStep::Spin);
                }
                if t == Test::Ipi {
                    self.results[self.cur].ipi += now - self.mark;
                    return None;
                }
                self.mark = now;
                Some(TaskStep::Compute(self.time_of(2000)))
            }
            _ => None,
        }
    }

    /// The results as kvm-unit-tests prints them.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, &t) in self.tests.iter().enumerate() {
            let r = self.results[i];
            if !self.valid(t) {
                out.push(format!("{} (skipped)", t.name()));
                continue;
            }
            if r.done == 0 {
                continue;
            }
            let per = |x: Time| self.cycles(x) / u64::from(r.done);
            out.push(format!("{} {}", t.name(), per(r.total)));
            if r.ipi > 0 {
                out.push(format!("  ipi {} {}", t.name(), per(r.ipi)));
            }
            if r.eoi > 0 {
                out.push(format!("  eoi {} {}", t.name(), per(r.eoi)));
            }
        }
        out
    }
}

impl App for Vmexit {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let now = sys.now;
        if !self.started {
            if now < self.start {
                return TaskStep::SleepUntil(self.start);
            }
            self.started = true;
            self.began = now;
        }
        loop {
            let Some(&t) = self.tests.get(self.cur) else {
                return TaskStep::Exit;
            };
            if !self.valid(t) {
                self.cur += 1;
                continue;
            }
            let s = self.step;
            if let Some(step) = self.iteration(t, s, now) {
                if step != TaskStep::Spin {
                    self.step += 1;
                }
                return step;
            }
            // The iteration is over.
            let r = &mut self.results[self.cur];
            r.done += 1;
            self.step = 0;
            self.x = 0;
            if r.done >= self.iterations {
                r.total = now - self.began;
                self.cur += 1;
                self.began = now;
            }
        }
    }

    fn varies(&self) -> bool {
        false
    }

    fn interrupt(&mut self, cpu: usize, vector: u8, now: Time, eoi_at: Time) -> bool {
        let Some(&t) = self.tests.get(self.cur) else {
            return false;
        };
        let ours = match t {
            Test::TscdeadlineImmed | Test::Tscdeadline => vector == self.timer_vector,
            Test::Ipi | Test::IpiHalt => vector == IPI_TEST_VECTOR && cpu == 1,
            t if t.self_ipi() => vector == IPI_TEST_VECTOR && cpu == 0,
            _ => false,
        };
        if !ours || !self.started {
            return false;
        }
        self.x += 1;
        if t.self_ipi() {
            // self_ipi_isr: tsc_eoi += the EOI's cycles.
            self.results[self.cur].eoi += now.saturating_sub(eoi_at);
        }
        true
    }

    fn metrics(&self, out: &mut Metrics) {
        for (i, &t) in self.tests.iter().enumerate() {
            let r = self.results[i];
            if r.done == 0 || !self.valid(t) {
                continue;
            }
            let per = |x: Time| self.cycles(x) as f64 / f64::from(r.done);
            out.insert(format!("vmexit.{}_cycles", t.name()), per(r.total));
            // What the test times apart (`tsc_ipi`, `tsc_eoi`), 0 included:
            // a write the processor virtualizes takes next to nothing.
            if t.self_ipi() || t == Test::Ipi {
                out.insert(format!("vmexit.{}_ipi_cycles", t.name()), per(r.ipi));
            }
            if t.self_ipi() {
                out.insert(format!("vmexit.{}_eoi_cycles", t.name()), per(r.eoi));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kvm_unit_tests() {
        for t in Test::ALL {
            let v: Test = serde_json::from_value(serde_json::json!(t.name())).unwrap();
            assert_eq!(v, t);
        }
    }
}
