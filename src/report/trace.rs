//! Timelines in the Chrome trace-event JSON format, which Perfetto and
//! chrome://tracing open: one track per physical core, with slices for guest
//! mode and for each VM exit (named by its KVM reason), and instant events
//! for interrupts entering the guest and for the guest's EOI writes.
//!
//! Events are collected in a buffer reserved up front (the limit), so
//! tracing allocates nothing per event either; events past the limit are
//! counted, not kept.

use crate::engine::Time;
use crate::hv::exits::ExitReason;

/// What one trace event shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// The core ran the guest (slice).
    Guest,
    /// A VM exit, from exit to the next entry (slice).
    Exit(ExitReason),
    /// The core was handed to the vCPU by the host scheduler (slice).
    ScheduleIn,
    /// An interrupt reached the guest's handler (instant).
    Deliver {
        /// Guest vector.
        vector: u8,
    },
    /// The guest wrote EOI (instant).
    Eoi {
        /// The vector the guest completes.
        vector: u8,
    },
}

/// One event on a core's track.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// What.
    pub kind: TraceKind,
    /// Physical core (the track).
    pub core: u16,
    /// Start, ps.
    pub start: Time,
    /// Length, ps (0 for instants).
    pub dur: Time,
}

/// A bounded trace of one run.
#[derive(Debug)]
pub struct Trace {
    from: Time,
    to: Time,
    limit: usize,
    events: Vec<TraceEvent>,
    /// Events inside the window that did not fit under the limit.
    pub dropped: u64,
}

impl Trace {
    /// A trace of what overlaps `[from, to)`, keeping at most `limit`
    /// events.
    pub fn new(from: Time, to: Time, limit: usize) -> Self {
        Trace {
            from,
            to,
            limit,
            events: Vec::with_capacity(limit.min(1 << 24)),
            dropped: 0,
        }
    }

    /// Records an event (ignored outside the window).
    #[inline]
    pub fn record(&mut self, kind: TraceKind, core: usize, start: Time, end: Time) {
        if end < self.from || start >= self.to {
            return;
        }
        if self.events.len() >= self.limit {
            self.dropped += 1;
            return;
        }
        self.events.push(TraceEvent {
            kind,
            core: core as u16,
            start,
            dur: end - start,
        });
    }

    /// The events kept, in recording order.
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// The trace as Chrome trace-event JSON (`{"traceEvents": [...]}`),
    /// times in µs with picosecond precision. `title` names the process.
    pub fn to_chrome_json(&self, title: &str, cores: usize) -> String {
        let mut v = Vec::with_capacity(64 + self.events.len() * 96);
        // Writing into a Vec cannot fail.
        let _ = self.write_chrome_json(&mut v, title, cores);
        String::from_utf8(v).unwrap_or_default()
    }

    /// Streams the Chrome trace-event JSON of [`Trace::to_chrome_json`] to
    /// `out` without building it in memory first.
    pub fn write_chrome_json(
        &self,
        out: &mut dyn std::io::Write,
        title: &str,
        cores: usize,
    ) -> std::io::Result<()> {
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        write!(
            out,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{{\"name\":{}}}}}",
            json_string(title)
        )?;
        for c in 0..cores {
            write!(
                out,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{c},\"args\":{{\"name\":\"core {c}\"}}}}"
            )?;
        }
        for e in &self.events {
            let ts = us(e.start);
            let tid = e.core;
            match e.kind {
                TraceKind::Guest => write!(
                    out,
                    ",\n{{\"name\":\"guest\",\"cat\":\"guest\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":0,\"tid\":{tid}}}",
                    us(e.dur)
                ),
                TraceKind::Exit(r) => write!(
                    out,
                    ",\n{{\"name\":\"{}\",\"cat\":\"exit\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":0,\"tid\":{tid}}}",
                    r.name(),
                    us(e.dur)
                ),
                TraceKind::ScheduleIn => write!(
                    out,
                    ",\n{{\"name\":\"schedule in\",\"cat\":\"host\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":0,\"tid\":{tid}}}",
                    us(e.dur)
                ),
                TraceKind::Deliver { vector } => write!(
                    out,
                    ",\n{{\"name\":\"irq 0x{vector:02x}\",\"cat\":\"interrupt\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts},\"pid\":0,\"tid\":{tid},\"args\":{{\"vector\":{vector}}}}}"
                ),
                TraceKind::Eoi { vector } => write!(
                    out,
                    ",\n{{\"name\":\"eoi 0x{vector:02x}\",\"cat\":\"eoi\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts},\"pid\":0,\"tid\":{tid},\"args\":{{\"vector\":{vector}}}}}"
                ),
            }?;
        }
        out.write_all(b"\n]}\n")
    }
}

/// Picoseconds as microseconds with all six decimals.
fn us(t: Time) -> String {
    format!("{}.{:06}", t / 1_000_000, t % 1_000_000)
}

fn json_string(t: &str) -> String {
    serde_json::to_string(t).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::US;

    #[test]
    fn window_and_limit_bound_what_is_kept() {
        let mut t = Trace::new(10 * US, 20 * US, 2);
        t.record(TraceKind::Guest, 1, 0, 5 * US); // before the window
        t.record(TraceKind::Guest, 1, 5 * US, 12 * US); // overlaps it
        t.record(TraceKind::Deliver { vector: 0x41 }, 1, 15 * US, 15 * US);
        t.record(TraceKind::Eoi { vector: 0x41 }, 1, 16 * US, 16 * US); // over the limit
        t.record(TraceKind::Guest, 1, 25 * US, 30 * US); // after
        assert_eq!(t.events().len(), 2);
        assert_eq!(t.dropped, 1);
        assert_eq!(t.events()[0].dur, 7 * US);
    }

    #[test]
    fn chrome_json_parses_and_names_tracks_and_slices() {
        let mut t = Trace::new(0, Time::MAX, 10);
        t.record(TraceKind::Guest, 1, 0, 1_500_000);
        t.record(
            TraceKind::Exit(ExitReason::MSR_WRITE),
            1,
            1_500_000,
            2_350_000,
        );
        t.record(TraceKind::Deliver { vector: 0xef }, 1, 2_350_000, 2_350_000);
        let v: serde_json::Value =
            serde_json::from_str(&t.to_chrome_json("a \"quoted\" run", 2)).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        // Process name, two thread names, three events.
        assert_eq!(ev.len(), 6);
        assert_eq!(ev[0]["args"]["name"], "a \"quoted\" run");
        assert_eq!(ev[2]["args"]["name"], "core 1");
        assert_eq!(ev[3]["name"], "guest");
        assert_eq!(ev[3]["dur"].as_f64(), Some(1.5));
        assert_eq!(ev[4]["name"], "MSR_WRITE");
        assert_eq!(ev[4]["ts"].as_f64(), Some(1.5));
        assert_eq!(ev[4]["dur"].as_f64(), Some(0.85));
        assert_eq!(ev[5]["ph"], "i");
        assert_eq!(ev[5]["args"]["vector"], 0xef);
    }
}
