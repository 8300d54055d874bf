//! In-kernel latency tests, as the DID authors measured their direct timer
//! and posted IPIs (did-implementation.md §6: an hrtimer module traced with
//! ftrace, `run_did send_ipi <cpu> <vector>`):
//!
//! * **hrtimer latency**: a kernel hrtimer armed every `interval` on one
//!   CPU (not a task: nothing is scheduled); the latency of one expiry is
//!   the time its callback runs in `hrtimer_interrupt` (handler entry)
//!   minus the expiry it was armed for. Missed periods are skipped
//!   (`hrtimer_forward`).
//! * **IPI latency**: an hrtimer on CPU 0 every `interval` queues a call
//!   to CPU 1 (`smp_call_function_single_async`: CALL_FUNCTION_SINGLE_VECTOR
//!   through the kernel's `apic->send_IPI`, so each scheme's IPI path
//!   carries it); the latency is the receiver's handler entry minus the
//!   time the sender issued the IPI. Calls queued before the receiver ran
//!   its handler are all served by that one IPI, each counted from its own
//!   send.

use super::{HrKind, Kernel};
use crate::engine::{as_us, LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, LatencyFamily, Metrics};
use std::collections::VecDeque;

/// The hrtimer latency module on one CPU.
pub(super) struct HrtimerLatency {
    interval: Time,
    hist: LatencyHistogram,
}

/// The IPI latency module: CPU `from` sends to CPU `to`.
pub(super) struct IpiLatency {
    interval: Time,
    pub(super) from: usize,
    pub(super) to: usize,
    /// The sender's hrtimer fired: send at the next chance.
    pub(super) due: bool,
    /// Send times of calls not yet served.
    sent: VecDeque<Time>,
    hist: LatencyHistogram,
}

/// The next expiry of a periodic timer of `interval` that expired at `t`,
/// after `now` (`hrtimer_forward`).
fn forward(t: Time, now: Time, interval: Time) -> Time {
    let i = interval.max(1);
    if now < t + i {
        t + i
    } else {
        t + ((now - t) / i + 1) * i
    }
}

impl Kernel {
    /// Loads the hrtimer latency module on `cpu`: its first expiry at
    /// `first`, then every `interval`.
    pub fn load_hrtimer_latency(&mut self, cpu: usize, first: Time, interval: Time) {
        let cpu = cpu.min(self.cpus.len() - 1);
        self.cpus[cpu].hrtimers.push((first, HrKind::LatencyProbe));
        self.hrtimer_latency = Some(HrtimerLatency {
            interval,
            hist: LatencyHistogram::new(),
        });
    }

    /// Loads the IPI latency module: CPU `from` sends to CPU `to`, first
    /// at `first`, then every `interval`.
    pub fn load_ipi_latency(&mut self, from: usize, to: usize, first: Time, interval: Time) {
        self.cpus[from].hrtimers.push((first, HrKind::IpiProbe));
        self.ipi_latency = Some(IpiLatency {
            interval,
            from,
            to,
            due: false,
            sent: VecDeque::with_capacity(16),
            hist: LatencyHistogram::new(),
        });
    }

    /// A test module's hrtimer armed for `t` runs its callback at `now`.
    pub(super) fn probe_expired(&mut self, kind: HrKind, t: Time, now: Time) {
        let next = match kind {
            HrKind::LatencyProbe => {
                let Some(p) = self.hrtimer_latency.as_mut() else {
                    return;
                };
                p.hist.record(now.saturating_sub(t));
                forward(t, now, p.interval)
            }
            HrKind::IpiProbe => {
                let Some(p) = self.ipi_latency.as_mut() else {
                    return;
                };
                p.due = true;
                forward(t, now, p.interval)
            }
            _ => return,
        };
        self.cpus[self.on].hrtimers.push((next, kind));
    }

    /// The IPI module's call is sent now (the ICR write, or the posted
    /// IPI's PIR store and notification, starts).
    pub(super) fn ipi_probe_sent(&mut self, now: Time) {
        if let Some(p) = self.ipi_latency.as_mut() {
            p.due = false;
            p.sent.push_back(now);
        }
    }

    /// CALL_FUNCTION_SINGLE's handler on this CPU runs the queued calls:
    /// each of the IPI module's is measured. Returns whether it had any.
    pub(super) fn ipi_probe_received(&mut self, now: Time) -> bool {
        let on = self.on;
        let Some(p) = self.ipi_latency.as_mut().filter(|p| p.to == on) else {
            return false;
        };
        let any = !p.sent.is_empty();
        while let Some(t) = p.sent.pop_front() {
            p.hist.record(now.saturating_sub(t));
        }
        any
    }

    /// Drops what the modules measured during the warm-up.
    pub(super) fn testmod_reset(&mut self) {
        if let Some(p) = self.hrtimer_latency.as_mut() {
            p.hist = LatencyHistogram::new();
        }
        if let Some(p) = self.ipi_latency.as_mut() {
            p.hist = LatencyHistogram::new();
        }
    }

    /// The modules' latency curves (p50 .. p99.9), maxima and sample
    /// counts.
    pub(super) fn testmod_metrics(&self, out: &mut Metrics) {
        let mut put = |name: &str, h: &LatencyHistogram| {
            insert_percentiles_us(out, &format!("{name}.latency"), h);
            out.insert(format!("{name}.latency_max_us"), as_us(h.max()));
            out.insert(format!("{name}.samples"), h.count() as f64);
        };
        if let Some(p) = &self.hrtimer_latency {
            put("hrtimer", &p.hist);
        }
        if let Some(p) = &self.ipi_latency {
            put("ipi", &p.hist);
        }
    }

    /// The distributions behind the modules' percentiles.
    pub(super) fn testmod_latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        if let Some(p) = &self.hrtimer_latency {
            out.push(LatencyFamily::us("hrtimer.latency", &p.hist));
        }
        if let Some(p) = &self.ipi_latency {
            out.push(LatencyFamily::us("ipi.latency", &p.hist));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::forward;

    #[test]
    fn forward_skips_missed_periods() {
        assert_eq!(forward(1000, 1001, 1000), 2000);
        assert_eq!(forward(1000, 1999, 1000), 2000);
        assert_eq!(forward(1000, 2000, 1000), 3000);
        assert_eq!(forward(1000, 5500, 1000), 6000);
    }
}
