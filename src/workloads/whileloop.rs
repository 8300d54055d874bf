//! WhileLoop (DID §5.3): a fixed count of integer additions, no privileged
//! instructions; its elapsed time shows the CPU the interrupt path takes.

use crate::engine::{as_s, Time};
use crate::guest::app::{App, Metrics, Sys, TaskStep};

/// The loop.
pub struct WhileLoop {
    work: Time,
    started: Option<Time>,
    /// When it finished.
    pub finished: Option<Time>,
    /// Elapsed time, start to finish.
    pub elapsed: Option<Time>,
}

impl WhileLoop {
    /// `iterations` of `cycles_per_iter` cycles at `ghz`.
    pub fn new(iterations: f64, cycles_per_iter: f64, ghz: f64) -> Self {
        WhileLoop {
            work: (iterations * cycles_per_iter / ghz * 1000.0).round() as Time,
            started: None,
            finished: None,
            elapsed: None,
        }
    }

    /// CPU time the loop needs with nothing else running.
    pub fn work(&self) -> Time {
        self.work
    }
}

impl App for WhileLoop {
    /// A fixed amount of computation, not a per-operation cost.
    fn varies(&self) -> bool {
        false
    }

    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        match self.started {
            None => {
                self.started = Some(sys.now);
                TaskStep::Compute(self.work)
            }
            Some(s) => {
                self.finished = Some(sys.now);
                self.elapsed = Some(sys.now - s);
                TaskStep::Exit
            }
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        // A loop that did not finish by the end of the run has no elapsed
        // time: NaN (null in JSON), never a number that reads as one.
        out.insert("elapsed_s".into(), self.elapsed.map_or(f64::NAN, as_s));
        out.insert("whileloop.ideal_s".into(), as_s(self.work));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_iterations_times_cycle_time() {
        let w = WhileLoop::new(3.4e9, 1.0, 3.4);
        assert_eq!(w.work(), crate::engine::SEC);
    }
}
