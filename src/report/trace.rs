//! Timelines in the Chrome trace-event JSON format, which Perfetto and
//! chrome://tracing open.
//!
//! Tracks (process / thread in the format's terms):
//! - **host cores** (pid 0): one track per physical core, with slices for
//!   guest mode, each VM exit and each schedule-in, named by VM and vCPU
//!   (`vm1 vcpu0: EXTERNAL_INTERRUPT`) with the exit's qualification in
//!   args; a zero-length slice where an interrupt enters the guest's
//!   handler and where the guest writes EOI; counter tracks of each core's
//!   run-queue length;
//! - **host threads** (pid 1): one track per host thread: the vhost
//!   workers' units of work and, under the host scheduler, the time each
//!   host thread (burner, vhost worker, vCPU thread) holds its core;
//! - **devices** (pid 2): one track per VM where its device interrupts are
//!   raised (VF MSIs, virtio irqfds), and a counter of the interrupts
//!   raised for it but not yet delivered.
//!
//! Flow arrows (the format's v2 flows: `bind_id` with `flow_out` /
//! `flow_in` on complete events) join a device interrupt's raise to its
//! delivery in the guest and to the guest's EOI of that vector.
//!
//! Events are collected in a buffer reserved up front (the limit), so
//! tracing allocates nothing per event either; events past the limit are
//! counted, not kept.

use crate::engine::Time;
use crate::hv::exits::ExitInfo;
use std::collections::HashMap;

/// What one trace event shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// The core ran the guest (slice; `who` is the vCPU).
    Guest,
    /// A VM exit, from exit to the next entry (slice; `who` is the vCPU).
    Exit(ExitInfo),
    /// An arm64 exit to EL2, from the trap to the next entry or to the
    /// vCPU thread blocking (slice; `who` is the vCPU).
    El2Exit(crate::hv::arm::ArmExit),
    /// An AMD SVM #VMEXIT, from the exit to the next VMRUN (slice; `who`
    /// is the vCPU).
    SvmExit(crate::hw::x86::vmcb::SvmExit),
    /// A RISC-V trap from VS mode to HS mode, from the trap to the next
    /// entry or to the vCPU thread blocking (slice; `who` is the vCPU).
    HsExit(crate::hv::riscv::RiscvExit),
    /// The core was handed to the vCPU by the host scheduler (slice).
    ScheduleIn,
    /// An interrupt reached the guest's handler (`who` is the vCPU).
    Deliver {
        /// Guest vector.
        vector: u8,
    },
    /// The guest wrote EOI (`who` is the vCPU).
    Eoi {
        /// The vector the guest completes.
        vector: u8,
    },
    /// A device raised an interrupt for VM `who` (`core`: where its
    /// message is sent).
    Raise {
        /// Guest vector.
        vector: u8,
    },
    /// Host thread `who` ran on `core` (slice).
    HostThread,
    /// `core`'s run queue holds `len` runnable threads (counter).
    RunQueue {
        /// Runnable threads, the running one included.
        len: u16,
    },
}

impl TraceKind {
    /// The slice an arm64 world records where a vCPU's time in EL2 ends:
    /// an exit's (named by its exception class), or a schedule-in's (the
    /// load path, no exit).
    pub fn el2_slice(exit: Option<crate::hv::arm::ArmExit>) -> TraceKind {
        exit.map_or(TraceKind::ScheduleIn, TraceKind::El2Exit)
    }
}

/// The x2APIC registers an MSR_WRITE exit names (MSR 0x800 + offset / 16,
/// SDM Vol. 3 Table 10-6), by MSR number.
const X2APIC_MSRS: [(u32, &str); 6] = [
    (0x80b, "x2APIC EOI"),
    (0x830, "x2APIC ICR"),
    (0x832, "x2APIC LVT timer"),
    (0x838, "x2APIC TMICT"),
    (0x83e, "x2APIC TDCR"),
    (0x6e0, "IA32_TSC_DEADLINE"),
];

/// An exit's qualification as a reader of the SDM writes it: registers,
/// ports and vectors in hex, an MSR with its name.
pub fn qualification(info: &ExitInfo) -> String {
    match *info {
        ExitInfo::MsrWrite { msr, value } => {
            let name = X2APIC_MSRS
                .iter()
                .find(|(m, _)| *m == msr)
                .map_or(String::new(), |(_, n)| format!(" ({n})"));
            format!("WRMSR {msr:#x}{name} <- {value:#x}")
        }
        ExitInfo::ExternalInterrupt { vector: Some(v) } => {
            format!("external interrupt, vector {v:#04x} acknowledged on exit")
        }
        ExitInfo::ExternalInterrupt { vector: None } => {
            "external interrupt, still requested in the LAPIC".into()
        }
        ExitInfo::IoInstruction { port } => format!("OUT to port {port:#06x}"),
        ExitInfo::Exception {
            vector,
            idt_vectoring,
        } => match idt_vectoring {
            Some(i) => format!("exception {vector} while delivering vector {i:#04x}"),
            None => format!("exception {vector}"),
        },
        ExitInfo::EoiInduced { vector } => format!("EOI of vector {vector:#04x}"),
        ExitInfo::ApicAccess { offset, value } => {
            format!("APIC page offset {offset:#05x} <- {value:#x}")
        }
        ref other => format!("{other:?}"),
    }
}

/// An arm64 exit's qualification: the trapped register access (ESR_EL2's
/// ISS for EC 0x18) or the exception class.
fn el2_qualification(exit: &crate::hv::arm::ArmExit) -> String {
    use crate::hv::arm::ArmExit;
    match *exit {
        ArmExit::Sys64 { reg, value } => format!("MSR {reg:?} <- {value:#x}"),
        ArmExit::Irq => "physical IRQ (HCR_EL2.IMO)".into(),
        ArmExit::Fiq => "physical FIQ (HCR_EL2.FMO)".into(),
        ArmExit::Wfx => "WFI trapped (HCR_EL2.TWI)".into(),
        ArmExit::DataAbort { port } => {
            format!("stage-2 data abort on MMIO (virtio notify {port:#x}, ioeventfd)")
        }
    }
}

/// How a GICv3 INTID reads: its class and, for the ones Linux's arm64
/// guest uses, what it is.
fn intid_label(intid: u32) -> String {
    let what = match intid {
        0..=15 => "SGI",
        27 => "PPI, virtual timer",
        16..=31 => "PPI",
        32..=1019 => "SPI",
        8192.. => "LPI",
        _ => "special",
    };
    format!("INTID {intid} ({what})")
}

/// One event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// What.
    pub kind: TraceKind,
    /// Physical core.
    pub core: u16,
    /// The vCPU, VM or host thread the event is about (see [`TraceKind`]).
    pub who: u32,
    /// Start, ps.
    pub start: Time,
    /// Length, ps (0 for instants).
    pub dur: Time,
}

/// Names for the tracks: what the world knows when the trace is written.
#[derive(Clone, Debug, Default)]
pub struct TraceNames {
    /// Physical cores.
    pub cores: usize,
    /// Per vCPU (global index): its VM and its index in the VM.
    pub vcpus: Vec<(usize, usize)>,
    /// Per host thread id: its name (`vhost worker 0`, `burner 1`, ...).
    pub host_threads: Vec<String>,
    /// VMs.
    pub vms: usize,
    /// arm64: per VM, the INTID of each guest handler vector (the guest's
    /// irq domain; empty on x86, whose interrupts are named by vector).
    pub intids: Vec<Vec<u32>>,
}

impl TraceNames {
    /// An interrupt of VM `vm` with guest handler `vector`, as its
    /// architecture names it: `INTID 27 (PPI, virtual timer)` on arm64,
    /// `0xef` on x86.
    pub fn irq(&self, vm: usize, vector: u8) -> String {
        match self.intids.get(vm).and_then(|t| t.get(vector as usize)) {
            // 1023: no INTID for that vector (spurious): keep the vector.
            Some(&i) if i != 1023 => intid_label(i),
            _ => format!("0x{vector:02x}"),
        }
    }
}

/// A bounded trace of one run.
#[derive(Debug)]
pub struct Trace {
    from: Time,
    to: Time,
    limit: usize,
    events: Vec<TraceEvent>,
    /// Per core: the host thread holding it since when (host scheduler).
    running: Vec<Option<(u32, Time)>>,
    /// Per core: the run-queue length last recorded.
    runqueue: Vec<u16>,
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
            running: Vec::new(),
            runqueue: Vec::new(),
            dropped: 0,
        }
    }

    /// Records an event (ignored outside the window).
    #[inline]
    pub fn record(&mut self, kind: TraceKind, core: usize, who: usize, start: Time, end: Time) {
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
            who: who as u32,
            start,
            dur: end - start,
        });
    }

    /// The host scheduler's state on `core` at `now`: the thread holding
    /// it (`current`, with whether it is a host thread rather than a vCPU
    /// thread, whose time shows on the core track) and how many are
    /// runnable there. Records a host-thread slice when one leaves the
    /// core, and a run-queue counter when the length changes.
    pub fn sched(&mut self, core: usize, current: Option<usize>, nr_running: usize, now: Time) {
        if self.running.len() <= core {
            self.running.resize(core + 1, None);
            self.runqueue.resize(core + 1, u16::MAX);
        }
        let cur = current.map(|t| t as u32);
        match self.running[core] {
            Some((t, _)) if Some(t) == cur => {}
            prev => {
                if let Some((t, since)) = prev {
                    self.record(TraceKind::HostThread, core, t as usize, since, now);
                }
                self.running[core] = cur.map(|t| (t, now));
            }
        }
        let len = nr_running.min(u16::MAX as usize - 1) as u16;
        // Before the window nothing is recorded: the first value inside
        // it is.
        if now >= self.from && self.runqueue[core] != len {
            self.runqueue[core] = len;
            self.record(TraceKind::RunQueue { len }, core, 0, now, now);
        }
    }

    /// Ends the slices still open at `now` (the end of the run).
    pub fn finish(&mut self, now: Time) {
        for core in 0..self.running.len() {
            if let Some((t, since)) = self.running[core].take() {
                self.record(TraceKind::HostThread, core, t as usize, since, now);
            }
        }
    }

    /// The events kept, in recording order.
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// The trace as Chrome trace-event JSON (`{"traceEvents": [...]}`),
    /// times in µs with picosecond precision. `title` names the run.
    pub fn to_chrome_json(&self, title: &str, names: &TraceNames) -> String {
        let mut v = Vec::with_capacity(64 + self.events.len() * 96);
        // Writing into a Vec cannot fail.
        let _ = self.write_chrome_json(&mut v, title, names);
        String::from_utf8(v).unwrap_or_default()
    }

    /// Streams the Chrome trace-event JSON of [`Trace::to_chrome_json`] to
    /// `out` without building it in memory first.
    pub fn write_chrome_json(
        &self,
        out: &mut dyn std::io::Write,
        title: &str,
        names: &TraceNames,
    ) -> std::io::Result<()> {
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        let meta = |out: &mut dyn std::io::Write,
                    what: &str,
                    pid: usize,
                    tid: usize,
                    name: &str|
         -> std::io::Result<()> {
            write!(
                out,
                "{{\"name\":\"{what}\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_string(name)
            )
        };
        meta(
            out,
            "process_name",
            PID_CORES,
            0,
            &format!("{title}: host cores"),
        )?;
        out.write_all(b",\n")?;
        meta(out, "process_name", PID_THREADS, 0, "host threads")?;
        out.write_all(b",\n")?;
        meta(out, "process_name", PID_DEVICES, 0, "device interrupts")?;
        for c in 0..names.cores {
            out.write_all(b",\n")?;
            meta(out, "thread_name", PID_CORES, c, &format!("core {c}"))?;
        }
        for (t, n) in names.host_threads.iter().enumerate() {
            out.write_all(b",\n")?;
            meta(out, "thread_name", PID_THREADS, t, n)?;
        }
        for vm in 0..names.vms {
            out.write_all(b",\n")?;
            meta(out, "thread_name", PID_DEVICES, vm, &format!("VM {vm}"))?;
        }
        let vcpu = |who: u32| {
            names
                .vcpus
                .get(who as usize)
                .copied()
                .unwrap_or((0, who as usize))
        };
        // Flows: a raise's id waits per (VM, vector) for its delivery,
        // then per (vCPU, vector) for the EOI.
        let mut raised: HashMap<(usize, u8), u64> = HashMap::new();
        let mut in_service: HashMap<(u32, u8), u64> = HashMap::new();
        let mut pending: Vec<u32> = vec![0; names.vms];
        let mut next_flow = 1u64;
        for e in &self.events {
            let ts = us(e.start);
            let tid = e.core;
            out.write_all(b",\n")?;
            match e.kind {
                TraceKind::Guest | TraceKind::ScheduleIn => {
                    let (vm, i) = vcpu(e.who);
                    let what = if e.kind == TraceKind::Guest {
                        "guest"
                    } else {
                        "schedule in"
                    };
                    let cat = if e.kind == TraceKind::Guest {
                        "guest"
                    } else {
                        "host"
                    };
                    write!(
                        out,
                        "{{\"name\":\"vm{vm} vcpu{i}: {what}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":{PID_CORES},\"tid\":{tid},\"args\":{{\"vm\":{vm},\"vcpu\":{i}}}}}",
                        us(e.dur)
                    )?;
                }
                TraceKind::Exit(_)
                | TraceKind::El2Exit(_)
                | TraceKind::SvmExit(_)
                | TraceKind::HsExit(_) => {
                    let (vm, i) = vcpu(e.who);
                    let (reason, q) = match e.kind {
                        TraceKind::Exit(info) => (info.reason().name(), qualification(&info)),
                        TraceKind::El2Exit(x) => (x.reason().name(), el2_qualification(&x)),
                        TraceKind::SvmExit(x) => (x.code().name(), format!("{x:?}")),
                        TraceKind::HsExit(x) => (x.reason().name(), format!("{x:?}")),
                        _ => unreachable!("matched above"),
                    };
                    write!(
                        out,
                        "{{\"name\":\"vm{vm} vcpu{i}: {reason}\",\"cat\":\"exit\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":{PID_CORES},\"tid\":{tid},\"args\":{{\"vm\":{vm},\"vcpu\":{i},\"reason\":\"{reason}\",\"qualification\":{}}}}}",
                        us(e.dur),
                        json_string(&q)
                    )?;
                }
                TraceKind::Raise { vector } => {
                    let vm = e.who as usize;
                    let id = next_flow;
                    next_flow += 1;
                    // A raise merged into one still pending keeps the
                    // older arrow (edge semantics: one delivery for both).
                    raised.entry((vm, vector)).or_insert(id);
                    if let Some(p) = pending.get_mut(vm) {
                        *p += 1;
                    }
                    write!(
                        out,
                        "{{\"name\":\"raise {}\",\"cat\":\"interrupt\",\"ph\":\"X\",\"ts\":{ts},\"dur\":0,\"pid\":{PID_DEVICES},\"tid\":{vm},\"bind_id\":{id},\"flow_out\":true,\"args\":{{\"vm\":{vm},\"vector\":{vector},\"core\":{}}}}},",
                        names.irq(vm, vector),
                        e.core
                    )?;
                    out.write_all(b"\n")?;
                    write!(
                        out,
                        "{{\"name\":\"pending interrupts\",\"ph\":\"C\",\"ts\":{ts},\"pid\":{PID_DEVICES},\"tid\":{vm},\"args\":{{\"VM {vm}\":{}}}}}",
                        pending.get(vm).copied().unwrap_or(0)
                    )?;
                }
                TraceKind::Deliver { vector } => {
                    let (vm, i) = vcpu(e.who);
                    let flow = raised.remove(&(vm, vector));
                    write!(
                        out,
                        "{{\"name\":\"vm{vm} vcpu{i}: irq {}\",\"cat\":\"interrupt\",\"ph\":\"X\",\"ts\":{ts},\"dur\":0,\"pid\":{PID_CORES},\"tid\":{tid},",
                        names.irq(vm, vector)
                    )?;
                    if let Some(id) = flow {
                        in_service.insert((e.who, vector), id);
                        write!(out, "\"bind_id\":{id},\"flow_in\":true,\"flow_out\":true,")?;
                    }
                    write!(
                        out,
                        "\"args\":{{\"vm\":{vm},\"vcpu\":{i},\"vector\":{vector}}}}}"
                    )?;
                    if flow.is_some() {
                        if let Some(p) = pending.get_mut(vm) {
                            *p = p.saturating_sub(1);
                        }
                        write!(
                            out,
                            ",\n{{\"name\":\"pending interrupts\",\"ph\":\"C\",\"ts\":{ts},\"pid\":{PID_DEVICES},\"tid\":{vm},\"args\":{{\"VM {vm}\":{}}}}}",
                            pending.get(vm).copied().unwrap_or(0)
                        )?;
                    }
                }
                TraceKind::Eoi { vector } => {
                    let (vm, i) = vcpu(e.who);
                    write!(
                        out,
                        "{{\"name\":\"vm{vm} vcpu{i}: eoi {}\",\"cat\":\"eoi\",\"ph\":\"X\",\"ts\":{ts},\"dur\":0,\"pid\":{PID_CORES},\"tid\":{tid},",
                        names.irq(vm, vector)
                    )?;
                    if let Some(id) = in_service.remove(&(e.who, vector)) {
                        write!(out, "\"bind_id\":{id},\"flow_in\":true,")?;
                    }
                    write!(
                        out,
                        "\"args\":{{\"vm\":{vm},\"vcpu\":{i},\"vector\":{vector}}}}}"
                    )?;
                }
                TraceKind::HostThread => {
                    let name = names
                        .host_threads
                        .get(e.who as usize)
                        .map(String::as_str)
                        .unwrap_or("host thread");
                    write!(
                        out,
                        "{{\"name\":{},\"cat\":\"host thread\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{},\"pid\":{PID_THREADS},\"tid\":{},\"args\":{{\"core\":{}}}}}",
                        json_string(name),
                        us(e.dur),
                        e.who,
                        e.core
                    )?;
                }
                TraceKind::RunQueue { len } => {
                    write!(
                        out,
                        "{{\"name\":\"run queue\",\"ph\":\"C\",\"ts\":{ts},\"pid\":{PID_CORES},\"tid\":{tid},\"args\":{{\"core {tid}\":{len}}}}}"
                    )?;
                }
            }
        }
        out.write_all(b"\n]}\n")
    }
}

/// The trace's processes.
const PID_CORES: usize = 0;
const PID_THREADS: usize = 1;
const PID_DEVICES: usize = 2;

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
        t.record(TraceKind::Guest, 1, 0, 0, 5 * US); // before the window
        t.record(TraceKind::Guest, 1, 0, 5 * US, 12 * US); // overlaps it
        t.record(TraceKind::Deliver { vector: 0x41 }, 1, 0, 15 * US, 15 * US);
        t.record(TraceKind::Eoi { vector: 0x41 }, 1, 0, 16 * US, 16 * US); // over the limit
        t.record(TraceKind::Guest, 1, 0, 25 * US, 30 * US); // after
        assert_eq!(t.events().len(), 2);
        assert_eq!(t.dropped, 1);
        assert_eq!(t.events()[0].dur, 7 * US);
    }

    fn names() -> TraceNames {
        TraceNames {
            cores: 2,
            vcpus: vec![(0, 0), (1, 0)],
            host_threads: vec!["vhost worker 0".into()],
            vms: 2,
            intids: Vec::new(),
        }
    }

    #[test]
    fn arm_exits_are_exit_slices_and_interrupts_are_named_by_intid() {
        use crate::hv::arm::ArmExit;
        let mut t = Trace::new(0, Time::MAX, 20);
        t.record(TraceKind::el2_slice(Some(ArmExit::Wfx)), 1, 0, 0, 1_000_000);
        t.record(TraceKind::el2_slice(None), 1, 0, 1_000_000, 2_000_000);
        t.record(
            TraceKind::Raise { vector: 0xef },
            1,
            0,
            2_000_000,
            2_000_000,
        );
        t.record(
            TraceKind::Deliver { vector: 0xef },
            1,
            0,
            3_000_000,
            3_000_000,
        );
        t.record(TraceKind::Eoi { vector: 0xef }, 1, 0, 4_000_000, 4_000_000);
        let mut n = names();
        // VM 0's guest: vector 0xef is its virtual timer, PPI 27.
        let mut v0 = vec![1023; 256];
        v0[0xef] = 27;
        n.intids = vec![v0, vec![1023; 256]];
        let v: serde_json::Value = serde_json::from_str(&t.to_chrome_json("arm", &n)).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let exits: Vec<&serde_json::Value> = ev.iter().filter(|e| e["cat"] == "exit").collect();
        assert_eq!(exits.len(), 1);
        assert_eq!(exits[0]["name"], "vm0 vcpu0: WFx");
        let names: Vec<&str> = ev.iter().filter_map(|e| e["name"].as_str()).collect();
        assert!(
            names.contains(&"vm0 vcpu0: irq INTID 27 (PPI, virtual timer)"),
            "{names:?}"
        );
        assert!(
            names.contains(&"raise INTID 27 (PPI, virtual timer)"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.contains("0xef")), "{names:?}");
        // The raise still flows to the delivery and the EOI.
        let flows = ev.iter().filter(|e| e.get("bind_id").is_some()).count();
        assert_eq!(flows, 3);
    }

    #[test]
    fn chrome_json_names_tracks_and_slices_by_vm_and_vcpu() {
        let mut t = Trace::new(0, Time::MAX, 20);
        t.record(TraceKind::Guest, 1, 1, 0, 1_500_000);
        t.record(
            TraceKind::Exit(ExitInfo::MsrWrite {
                msr: 0x80b,
                value: 0,
            }),
            1,
            1,
            1_500_000,
            2_350_000,
        );
        let v: serde_json::Value =
            serde_json::from_str(&t.to_chrome_json("a \"quoted\" run", &names())).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let meta: Vec<&serde_json::Value> = ev.iter().filter(|e| e["ph"] == "M").collect();
        // Three processes, two cores, one host thread, two VMs.
        assert_eq!(meta.len(), 3 + 2 + 1 + 2);
        assert_eq!(meta[0]["args"]["name"], "a \"quoted\" run: host cores");
        let slices: Vec<&serde_json::Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices[0]["name"], "vm1 vcpu0: guest");
        assert_eq!(slices[0]["dur"].as_f64(), Some(1.5));
        assert_eq!(slices[1]["name"], "vm1 vcpu0: MSR_WRITE");
        assert_eq!(slices[1]["args"]["reason"], "MSR_WRITE");
        assert_eq!(
            slices[1]["args"]["qualification"],
            "WRMSR 0x80b (x2APIC EOI) <- 0x0"
        );
        assert_eq!(slices[1]["ts"].as_f64(), Some(1.5));
        assert_eq!(slices[1]["dur"].as_f64(), Some(0.85));
    }

    #[test]
    fn a_raise_flows_to_its_delivery_and_its_eoi() {
        let mut t = Trace::new(0, Time::MAX, 20);
        t.record(
            TraceKind::Raise { vector: 0x51 },
            1,
            1,
            1_000_000,
            1_000_000,
        );
        // Merged into the pending one: no arrow of its own.
        t.record(
            TraceKind::Raise { vector: 0x51 },
            1,
            1,
            1_100_000,
            1_100_000,
        );
        t.record(
            TraceKind::Deliver { vector: 0x51 },
            1,
            1,
            2_000_000,
            2_000_000,
        );
        t.record(TraceKind::Eoi { vector: 0x51 }, 1, 1, 3_000_000, 3_000_000);
        // Another VM's vector: not joined to VM 1's raise.
        t.record(
            TraceKind::Deliver { vector: 0x51 },
            0,
            0,
            3_500_000,
            3_500_000,
        );
        let v: serde_json::Value = serde_json::from_str(&t.to_chrome_json("r", &names())).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let with_id: Vec<&serde_json::Value> =
            ev.iter().filter(|e| e.get("bind_id").is_some()).collect();
        assert_eq!(with_id.len(), 4, "{with_id:?}");
        let first = &with_id[0]["bind_id"];
        assert_eq!(with_id[0]["flow_out"], true);
        assert_eq!(with_id[0]["pid"], 2);
        let deliver = with_id
            .iter()
            .find(|e| e["pid"] == 0 && e["cat"] == "interrupt");
        let deliver = deliver.expect("the delivery carries the flow");
        assert_eq!(&deliver["bind_id"], first);
        assert_eq!(
            (deliver["flow_in"].as_bool(), deliver["flow_out"].as_bool()),
            (Some(true), Some(true))
        );
        let eoi = with_id
            .iter()
            .find(|e| e["cat"] == "eoi")
            .expect("the EOI ends it");
        assert_eq!(&eoi["bind_id"], first);
        assert_eq!(eoi["flow_in"], true);
        let other = ev
            .iter()
            .find(|e| e["name"] == "vm0 vcpu0: irq 0x51")
            .expect("VM 0's delivery");
        assert!(other.get("bind_id").is_none());
        // The pending counter: 1, 2, then 1 after the delivery.
        let pending: Vec<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "pending interrupts")
            .map(|e| e["args"]["VM 1"].as_u64().unwrap())
            .collect();
        assert_eq!(pending, [1, 2, 1]);
    }

    #[test]
    fn host_threads_get_slices_and_cores_a_run_queue_counter() {
        let mut t = Trace::new(0, Time::MAX, 20);
        t.sched(1, Some(0), 1, 1_000_000);
        t.sched(1, Some(0), 2, 1_500_000); // same thread, longer queue
        t.sched(1, None, 0, 4_000_000); // it left the core
        t.finish(5_000_000);
        let v: serde_json::Value = serde_json::from_str(&t.to_chrome_json("r", &names())).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let threads: Vec<&serde_json::Value> =
            ev.iter().filter(|e| e["cat"] == "host thread").collect();
        assert_eq!(threads.len(), 1);
        assert_eq!(threads[0]["name"], "vhost worker 0");
        assert_eq!(
            (threads[0]["ts"].as_f64(), threads[0]["dur"].as_f64()),
            (Some(1.0), Some(3.0))
        );
        assert_eq!(threads[0]["pid"], 1);
        let queue: Vec<u64> = ev
            .iter()
            .filter(|e| e["name"] == "run queue")
            .map(|e| e["args"]["core 1"].as_u64().unwrap())
            .collect();
        assert_eq!(queue, [1, 2, 0]);
    }
}
