//! The race explorer: runs a small scenario many times with the event
//! order perturbed — ties at one picosecond broken in a seeded random
//! order, messages in flight (MSIs, IPIs, the host's schedule-out/in)
//! arriving up to a bounded jitter late — under the invariant checker, and
//! turns the first failing run into a minimal counterexample: the smallest
//! perturbation that still fails and the events around where the trouble
//! started.
//!
//! Each run is one interleaving of the scenario's concurrent events; every
//! run is a pure function of (scenario, seed, perturbation), so a
//! counterexample replays exactly (`exitless explore --replay`).

use crate::calibration::Calibration;
use crate::check::Violation;
use crate::engine::{as_us, Time, US};
use crate::scenario::Scenario;
use crate::world::event::Ev;
use crate::world::{BuildError, World};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One perturbation of the event order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perturbation {
    /// Seed of the tie-break order and the jitter draws.
    pub seed: u64,
    /// Largest extra delay of a message in flight, ps.
    pub max_jitter: Time,
    /// Whether same-time ties break randomly (else in scheduling order).
    pub shuffle_ties: bool,
}

/// What to explore.
#[derive(Clone, Copy, Debug)]
pub struct ExploreOptions {
    /// Perturbed runs (interleavings) to try.
    pub runs: u64,
    /// Largest extra delay of a message in flight, ps.
    pub max_jitter: Time,
    /// Whether same-time ties break randomly.
    pub shuffle_ties: bool,
    /// Simulations in parallel.
    pub threads: usize,
}

/// Events kept before the end of a counterexample's trace run.
const TRACE_EVENTS: usize = 200;
/// A counterexample's trace shows this much around the violation's origin.
const TRACE_WINDOW: Time = 5 * US;

/// A failing interleaving, minimized.
#[derive(Clone, Debug)]
pub struct Counterexample {
    /// The perturbation (None: the unperturbed run fails by itself).
    pub perturbation: Option<Perturbation>,
    /// The first violations of that run.
    pub violations: Vec<Violation>,
    /// Where the earliest violation started (ps).
    pub origin: Time,
    /// The dispatched events within [`TRACE_WINDOW`] of `origin`.
    pub trace: Vec<(Time, Ev)>,
}

/// The result of exploring one scenario.
#[derive(Clone, Debug)]
pub struct Exploration {
    /// Scheme explored.
    pub scheme: String,
    /// Interleavings run.
    pub runs: u64,
    /// Of those, the ones with a violation.
    pub failing_runs: u64,
    /// Events dispatched over all runs.
    pub events: u64,
    /// The minimized first failure, if any.
    pub counterexample: Option<Counterexample>,
}

/// How a run's world is built: [`World::build`], or a caller's own (a
/// scheme written outside the crate, through [`World::build_with`]).
pub type Builder<'a> = &'a (dyn Fn(&Scenario, &Calibration) -> Result<World, BuildError> + Sync);

fn default_build(s: &Scenario, cal: &Calibration) -> Result<World, BuildError> {
    World::build(s, cal)
}

/// Runs `s` once under `p`, optionally stopping early and logging events.
fn run_once(
    build: Builder,
    s: &Scenario,
    cal: &Calibration,
    p: Option<Perturbation>,
    stop_at: Option<Time>,
    log: bool,
) -> Result<World, BuildError> {
    let mut w = build(s, cal)?;
    if let Some(p) = p {
        w.perturb(p.seed, p.max_jitter, p.shuffle_ties);
    }
    if let Some(t) = stop_at {
        w.stop_at(t);
    }
    if log {
        w.enable_event_log(TRACE_EVENTS);
    }
    w.run(|_| {});
    Ok(w)
}

fn fails(
    build: Builder,
    s: &Scenario,
    cal: &Calibration,
    p: Option<Perturbation>,
) -> Result<bool, BuildError> {
    Ok(run_once(build, s, cal, p, None, false)?.checker.total() > 0)
}

/// Explores `opts.runs` perturbed interleavings of `s` (perturbation seeds
/// 1..=runs); `progress(done, failing)` is called as runs finish.
pub fn explore(
    s: &Scenario,
    cal: &Calibration,
    opts: ExploreOptions,
    progress: impl Fn(u64, u64) + Sync,
) -> Result<Exploration, BuildError> {
    explore_with(&default_build, s, cal, opts, progress)
}

/// [`explore`] with worlds from `build`.
pub fn explore_with(
    build: Builder,
    s: &Scenario,
    cal: &Calibration,
    opts: ExploreOptions,
    progress: impl Fn(u64, u64) + Sync,
) -> Result<Exploration, BuildError> {
    // Build once up front so a bad scenario is one clear error.
    let scheme = build(s, cal)?.report().scheme;
    let next = AtomicU64::new(1);
    let done = AtomicU64::new(0);
    let failing = Mutex::new(Vec::<u64>::new());
    let events = AtomicU64::new(0);
    let error = Mutex::new(None::<BuildError>);
    std::thread::scope(|scope| {
        for _ in 0..opts.threads.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed > opts.runs {
                    return;
                }
                let p = Perturbation {
                    seed,
                    max_jitter: opts.max_jitter,
                    shuffle_ties: opts.shuffle_ties,
                };
                match run_once(build, s, cal, Some(p), None, false) {
                    Ok(w) => {
                        events.fetch_add(w.events(), Ordering::Relaxed);
                        let mut f = failing.lock().expect("no panics hold it");
                        if w.checker.total() > 0 {
                            f.push(seed);
                        }
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        progress(d, f.len() as u64);
                    }
                    Err(e) => {
                        *error.lock().expect("no panics hold it") = Some(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().expect("threads joined") {
        return Err(e);
    }
    let failing = failing.into_inner().expect("threads joined");
    let counterexample = match failing.iter().min() {
        Some(&seed) => Some(minimize(
            build,
            s,
            cal,
            Perturbation {
                seed,
                max_jitter: opts.max_jitter,
                shuffle_ties: opts.shuffle_ties,
            },
        )?),
        None => None,
    };
    Ok(Exploration {
        scheme,
        runs: opts.runs,
        failing_runs: failing.len() as u64,
        events: events.into_inner(),
        counterexample,
    })
}

/// Shrinks a failing perturbation: none at all if the plain run fails, then
/// ties in scheduling order if that still fails, then the jitter halved
/// while it still fails; and records the events around the first
/// violation.
pub fn minimize(
    build: Builder,
    s: &Scenario,
    cal: &Calibration,
    p: Perturbation,
) -> Result<Counterexample, BuildError> {
    let mut best = if fails(build, s, cal, None)? {
        None
    } else {
        Some(p)
    };
    if let Some(mut q) = best {
        if q.shuffle_ties {
            let fifo = Perturbation {
                shuffle_ties: false,
                ..q
            };
            if fails(build, s, cal, Some(fifo))? {
                q = fifo;
            }
        }
        while q.max_jitter > 1 {
            let half = Perturbation {
                max_jitter: q.max_jitter / 2,
                ..q
            };
            if !fails(build, s, cal, Some(half))? {
                break;
            }
            q = half;
        }
        best = Some(q);
    }
    counterexample_with(build, s, cal, best)
}

/// Replays one perturbation and reports its violations and trace.
pub fn counterexample(
    s: &Scenario,
    cal: &Calibration,
    p: Option<Perturbation>,
) -> Result<Counterexample, BuildError> {
    counterexample_with(&default_build, s, cal, p)
}

/// [`counterexample`] with worlds from `build`.
pub fn counterexample_with(
    build: Builder,
    s: &Scenario,
    cal: &Calibration,
    p: Option<Perturbation>,
) -> Result<Counterexample, BuildError> {
    let full = run_once(build, s, cal, p, None, false)?;
    let violations: Vec<Violation> = full.checker.violations().iter().take(8).cloned().collect();
    let origin = violations.iter().map(|v| v.origin).min().unwrap_or(0);
    let mut trace = Vec::new();
    if !violations.is_empty() {
        // The same run again, stopped just after the origin: everything up
        // to there happens exactly as in the failing run.
        let w = run_once(build, s, cal, p, Some(origin + TRACE_WINDOW), true)?;
        if let Some(log) = w.event_log() {
            trace = log
                .events()
                .filter(|(t, _)| *t + TRACE_WINDOW >= origin)
                .copied()
                .collect();
        }
    }
    Ok(Counterexample {
        perturbation: p,
        violations,
        origin,
        trace,
    })
}

/// Describes a perturbation as replay flags.
pub fn replay_flags(p: &Option<Perturbation>) -> String {
    match p {
        None => "(no perturbation needed)".into(),
        Some(p) => format!(
            "--replay {} --jitter-ns {}{}",
            p.seed,
            p.max_jitter as f64 / 1000.0,
            if p.shuffle_ties { "" } else { " --fifo-ties" }
        ),
    }
}

/// The command that reproduces a run of `scenario_path` as the user gave
/// it: the global options (`--calibration`, `--calibration-set`) and the
/// scenario's `--set` overrides, each word shell-quoted where it needs to
/// be, so a printed replay line runs the same scenario.
pub fn replay_command(global: &[String], scenario_path: &str, sets: &[String]) -> String {
    let quote = |w: &str| {
        let plain = !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
        if plain {
            w.to_string()
        } else {
            format!("'{}'", w.replace('\'', "'\\''"))
        }
    };
    let mut words = vec!["exitless".to_string()];
    words.extend(global.iter().map(|w| quote(w)));
    words.push("explore".into());
    words.push(quote(scenario_path));
    for kv in sets {
        words.push("--set".into());
        words.push(quote(kv));
    }
    words.join(" ")
}

/// The text report of an exploration; `replay` is the command prefix of its
/// replay line ([`replay_command`]).
pub fn render(x: &Exploration, opts: &ExploreOptions, scenario_path: &str, replay: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "explore {}: scheme {}: {} interleavings (perturbation seeds 1..={}, in-flight jitter <= {} ns, ties {}), {} events",
        scenario_path,
        x.scheme,
        x.runs,
        x.runs,
        opts.max_jitter as f64 / 1000.0,
        if opts.shuffle_ties { "shuffled" } else { "in scheduling order" },
        x.events
    );
    let _ = writeln!(o, "  failing interleavings: {}", x.failing_runs);
    if let Some(c) = &x.counterexample {
        o += &render_counterexample(c, &x.scheme, replay);
    } else {
        let _ = writeln!(o, "  no violation found");
    }
    o
}

/// The text of one counterexample; `replay` is the command prefix of its
/// replay line ([`replay_command`]).
pub fn render_counterexample(c: &Counterexample, scheme: &str, replay: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "  minimal counterexample: {}",
        match &c.perturbation {
            None => "the unperturbed run fails".to_string(),
            Some(p) => format!(
                "perturbation seed {}, jitter <= {} ns, ties {}",
                p.seed,
                p.max_jitter as f64 / 1000.0,
                if p.shuffle_ties {
                    "shuffled"
                } else {
                    "in scheduling order"
                }
            ),
        }
    );
    // The user's own `--set scheme=`/`config=` already names the scheme
    // (a second one would repeat it, or clash with `config`).
    let named = replay.contains(" --set scheme=") || replay.contains(" --set config=");
    let scheme_set = if named {
        String::new()
    } else {
        format!(" --set scheme={scheme}")
    };
    let _ = writeln!(
        o,
        "  replay: {replay}{scheme_set} {}",
        replay_flags(&c.perturbation)
    );
    for v in &c.violations {
        let _ = writeln!(
            o,
            "  violation: t={:.3} us vm{} {:?} vector {:#x}: {}",
            v.time_us, v.vm, v.kind, v.vector, v.detail
        );
    }
    let _ = writeln!(
        o,
        "  events within {} us of {:.3} us:",
        as_us(TRACE_WINDOW),
        as_us(c.origin)
    );
    for (t, e) in &c.trace {
        let mark = if *t == c.origin { " <-" } else { "" };
        let _ = writeln!(o, "    {:>14.6} us  {}{mark}", as_us(*t), describe(e));
    }
    o
}

/// An event of a counterexample trace in words: what happens, where, with
/// vectors in hex (the SDM's and Linux's notation). Generations (which
/// make a stale event harmless) are shown as such. Events without a
/// sentence of their own keep their field names.
pub fn describe(e: &Ev) -> String {
    use crate::hw::x86::lapic::DeliveryMode;
    match *e {
        Ev::GuestPoke { vcpu } => format!("vCPU {vcpu}: its polling idle loop sees need_resched"),
        Ev::Segment { core, gen } => {
            format!("core {core}: its work segment ends (segment generation {gen})")
        }
        Ev::GuestDeadline { vcpu } => {
            format!("vCPU {vcpu}: its guest deadline (APIC-timer virtualization) comes due")
        }
        Ev::LapicTimer { core, gen } => {
            format!("core {core}: LAPIC timer deadline due (timer generation {gen})")
        }
        Ev::ApicArrive { core, vector, mode } => match mode {
            DeliveryMode::Nmi => format!("core {core}: an NMI reaches its LAPIC"),
            DeliveryMode::Fixed => {
                format!("core {core}: vector {vector:#04x} (fixed) reaches its LAPIC")
            }
            DeliveryMode::LowestPriority => {
                format!("core {core}: vector {vector:#04x} (lowest priority) reaches its LAPIC")
            }
        },
        Ev::Msi {
            handle,
            requester_id,
        } => format!(
            "device {requester_id:#06x}: its MSI (IRT entry {handle}) reaches the IOMMU"
        ),
        Ev::NicItr { vf, vector, gen } => format!(
            "VF {vf}: the ITR interval of its MSI-X vector {vector} expires (countdown generation {gen})"
        ),
        Ev::PreemptionTimer { core, gen } => format!(
            "core {core}: VMX-preemption timer reaches zero (arming generation {gen})"
        ),
        Ev::WireRx { vf, len, seq, .. } => {
            format!("VF {vf}: frame {seq} ({len} bytes) arrives from the wire")
        }
        Ev::ClientTx { vm } => format!("load generator: sends to VM {vm}"),
        Ev::Eventfd { fd } => format!("eventfd {fd} signalled"),
        Ev::VhostStep { worker } => format!("vhost worker {worker}: next unit of work"),
        Ev::HostIpi { core } => format!("core {core}: a host IPI arrives"),
        Ev::Deschedule { vcpu } => format!("vCPU {vcpu}: the host deschedules it"),
        Ev::Reschedule { vcpu } => format!("vCPU {vcpu}: the host schedules it back in"),
        Ev::SchedTick { core } => format!("core {core}: host scheduler tick"),
        Ev::WakeVcpu { vcpu } => format!("vCPU {vcpu}: its halted thread is woken"),
        Ev::Resched { core } => format!("core {core}: host scheduler reschedules"),
        Ev::HaltPollEnd { vcpu, gen } => {
            format!("vCPU {vcpu}: halt polling window ends (generation {gen})")
        }
        Ev::WarmupEnd => "warm-up ends: measuring starts".into(),
        ref other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counterexample_events_read_as_sentences_with_hex_vectors() {
        use crate::hw::x86::lapic::DeliveryMode;
        let d = super::describe(&super::Ev::Segment { core: 1, gen: 5 });
        assert_eq!(d, "core 1: its work segment ends (segment generation 5)");
        let d = super::describe(&super::Ev::ApicArrive {
            core: 2,
            vector: 0xef,
            mode: DeliveryMode::Fixed,
        });
        assert!(d.contains("0xef") && !d.contains("239"), "{d}");
    }

    use super::*;

    fn scenario(scheme: &str) -> Scenario {
        let text = format!(
            "name = \"x\"\nscheme = \"{scheme}\"\nseed = 1\nduration_s = 0.01\nwarmup_s = 0.001\n\
             [workload.udp]\nrate_pps = 100000\n"
        );
        Scenario::parse(&text, &[]).unwrap()
    }

    #[test]
    fn a_run_replays_exactly_under_the_same_perturbation() {
        let s = scenario("kvm");
        let cal = Calibration::default_host();
        let p0 = Perturbation {
            seed: 3,
            max_jitter: 200_000,
            shuffle_ties: true,
        };
        let p = Some(p0);
        let a = run_once(&default_build, &s, &cal, p, None, false).unwrap();
        let b = run_once(&default_build, &s, &cal, p, None, false).unwrap();
        assert_eq!(a.events(), b.events());
        assert_eq!(a.report().metrics, b.report().metrics);
        // A different perturbation is a different interleaving.
        let q = Some(Perturbation { seed: 4, ..p0 });
        let c = run_once(&default_build, &s, &cal, q, None, false).unwrap();
        assert_ne!(
            serde_json::to_string(&a.report().metrics).unwrap(),
            serde_json::to_string(&c.report().metrics).unwrap()
        );
    }

    #[test]
    fn a_stopped_run_logs_its_last_events_in_order() {
        let s = scenario("did");
        let cal = Calibration::default_host();
        let w = run_once(&default_build, &s, &cal, None, Some(2_000 * US), true).unwrap();
        let log: Vec<_> = w.event_log().unwrap().events().copied().collect();
        assert_eq!(log.len(), TRACE_EVENTS);
        assert!(log.windows(2).all(|p| p[0].0 <= p[1].0));
        assert!(log.last().unwrap().0 <= 2_000 * US);
    }

    #[test]
    fn the_replay_command_repeats_every_option_quoted_for_the_shell() {
        let cmd = replay_command(
            &[
                "--calibration".into(),
                "my host.toml".into(),
                "--calibration-set".into(),
                "exit.hlt_us=1.5".into(),
            ],
            "validation/did/figure3.toml",
            &["duration_s=0.01".into(), "name=it's".into()],
        );
        assert_eq!(
            cmd,
            "exitless --calibration 'my host.toml' --calibration-set exit.hlt_us=1.5 \
             explore validation/did/figure3.toml --set duration_s=0.01 --set 'name=it'\\''s'"
        );
    }
}
