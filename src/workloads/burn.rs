//! A CPU burner inside the guest: ES2's "CPU-burn scripts" (§6.3), a
//! lowest-priority task on each vCPU that never sleeps, so a vCPU is always
//! runnable on the host and the host scheduler keeps switching vCPUs.

use crate::engine::{Time, MS};
use crate::guest::app::{App, Metrics, Sys, TaskStep};

/// A task that computes forever in 1 ms steps and reports the CPU it got.
#[derive(Debug, Default)]
pub struct Burn {
    ran: Time,
    started: bool,
}

impl Burn {
    /// A new burner.
    pub fn new() -> Self {
        Burn::default()
    }
}

impl App for Burn {
    /// A fixed amount of computation, not a per-operation cost.
    fn varies(&self) -> bool {
        false
    }

    fn step(&mut self, _sys: &mut Sys) -> TaskStep {
        // Each step is called once the previous millisecond was computed.
        if self.started {
            self.ran += MS;
        }
        self.started = true;
        TaskStep::Compute(MS)
    }

    fn reset_metrics(&mut self) {
        self.ran = 0;
    }

    /// Burners of one VM add up (`burn.cpu_s`: guest CPU seconds they got).
    fn metrics(&self, out: &mut Metrics) {
        *out.entry("burn.cpu_s".into()).or_insert(0.0) += crate::engine::as_s(self.ran);
    }
}
