//! ES2 (Hu et al., docs/papers.md ES2): a host-only change to the
//! paravirtual event path, on top of posted interrupts.
//!
//! * **Hybrid I/O handling** (§2.4–2.6) lives in the vhost back end
//!   ([`super::vhost`]): joint I/O threads serving up to `combining_level`
//!   devices, and the perceptive (quota) or optimistic (RX-triggered) switch
//!   of TX handlers between notification and polling.
//! * **Intelligent interrupt redirection** (§2.7) is here: KVM's preempt
//!   notifiers keep, per VM, the set of vCPUs on a core (`online`) and the
//!   descheduled ones in the order they left (`offline`). When a device
//!   MSI of the VM is delivered (`kvm_arch_set_irq_inatomic`), its
//!   destination is rewritten: the sticky vCPU if it is online, else the
//!   online vCPU that has processed the fewest interrupts (which becomes
//!   sticky until it is descheduled), else the head of the offline list
//!   (descheduled longest, guessed to run first). Only device vectors move
//!   (the timer and IPIs are per-CPU), and only under lowest-priority
//!   delivery, which lets any vCPU of the set take the vector.

use super::exits::ExitInfo;
use super::vhost::Hybrid;
use crate::hw::x86::lapic::msr;

/// The exit causes ES2 counts (§6.2, Table 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// An external-interrupt exit on the IPI that kicks a vCPU in guest
    /// mode so a virtual interrupt can be injected.
    InterruptDelivery,
    /// The guest's EOI write exits (on ES2's xAPIC guest an APIC access at
    /// 0x0B0; on an x2APIC guest an EOI MSR write).
    EoiWrite,
    /// A PIO write (the virtio kick) exits.
    IoInstruction,
}

impl Cause {
    /// Every cause, in report order.
    pub const ALL: [Cause; 3] = [
        Cause::InterruptDelivery,
        Cause::EoiWrite,
        Cause::IoInstruction,
    ];

    /// Its name in reports (`exits_per_s.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Cause::InterruptDelivery => "interrupt_delivery",
            Cause::EoiWrite => "eoi_write",
            Cause::IoInstruction => "io_instruction",
        }
    }

    /// The cause of an exit, if ES2 counts it.
    pub fn of(info: &ExitInfo) -> Option<Cause> {
        match *info {
            ExitInfo::ExternalInterrupt {
                vector: Some(super::host::RESCHEDULE_VECTOR),
            } => Some(Cause::InterruptDelivery),
            ExitInfo::MsrWrite { msr: msr::EOI, .. }
            | ExitInfo::ApicAccess { offset: 0xB0, .. }
            | ExitInfo::ApicWrite { offset: 0xB0, .. } => Some(Cause::EoiWrite),
            ExitInfo::IoInstruction { .. } => Some(Cause::IoInstruction),
            _ => None,
        }
    }
}

/// ES2's hybrid I/O handling policy (`[hv] es2_hybrid`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Es2Hybrid {
    /// Stock vhost: one worker per device, kicks suppressed only while a
    /// handler runs.
    #[default]
    Off,
    /// Joint threads, perceptive mode switch (quota).
    Perceptive,
    /// Joint threads, optimistic mode switch (RX-triggered TX polling).
    Optimistic,
}

/// ES2's parameters as a scenario sets them (defaults: the paper's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Es2Options {
    /// Hybrid I/O handling.
    pub hybrid: Es2Hybrid,
    /// Perceptive quota (§5.2: at most 4 for TCP, 16 for UDP).
    pub quota: u32,
    /// Optimistic `max_poll_count` (§5.3: 1000).
    pub max_poll_count: u32,
    /// Devices per joint thread (§5.1: 4).
    pub combining_level: u32,
    /// The joint thread's interruptible sleep, µs (§5.2: 10).
    pub sleep_us: f64,
    /// Intelligent interrupt redirection.
    pub redirect: bool,
}

impl Default for Es2Options {
    fn default() -> Self {
        Es2Options {
            hybrid: Es2Hybrid::Off,
            quota: 4,
            max_poll_count: 1000,
            combining_level: 4,
            sleep_us: 10.0,
            redirect: false,
        }
    }
}

impl Es2Options {
    /// The vhost workers' policy.
    pub fn vhost_policy(&self) -> Hybrid {
        match self.hybrid {
            Es2Hybrid::Off => Hybrid::Off,
            Es2Hybrid::Perceptive => Hybrid::Perceptive { quota: self.quota },
            Es2Hybrid::Optimistic => Hybrid::Optimistic {
                max_poll_count: self.max_poll_count,
            },
        }
    }

    /// Devices one worker thread serves: joint threads only with hybrid
    /// handling (the paper describes merging under H; PI and PI+R keep
    /// stock per-device threads).
    pub fn devices_per_worker(&self) -> usize {
        match self.hybrid {
            Es2Hybrid::Off => 1,
            _ => self.combining_level.max(1) as usize,
        }
    }
}

/// Per-VM redirection state (§2.7).
#[derive(Clone, Debug, Default)]
pub struct Redirect {
    /// vCPUs (global indices) whose threads are on a core.
    online: Vec<usize>,
    /// Descheduled vCPUs, oldest first (the tail is the newest).
    offline: Vec<usize>,
    /// The online vCPU device interrupts stick to.
    sticky: Option<usize>,
    /// Interrupts each vCPU (by its index in the VM) was given.
    processed: Vec<u64>,
    /// Interrupts whose destination was rewritten.
    pub redirected: u64,
    /// Interrupts sent to the head of the offline list (no vCPU online).
    pub to_offline: u64,
}

impl Redirect {
    /// A VM whose vCPUs (global indices) all start descheduled in order.
    pub fn new(vcpus: &[usize]) -> Self {
        Redirect {
            online: Vec::with_capacity(vcpus.len()),
            offline: vcpus.to_vec(),
            sticky: None,
            processed: vec![0; vcpus.len()],
            redirected: 0,
            to_offline: 0,
        }
    }

    /// The warm-up is over: counters restart.
    pub fn reset_counters(&mut self) {
        self.redirected = 0;
        self.to_offline = 0;
    }

    /// `kvm_sched_in`: `vcpu` is about to run.
    pub fn sched_in(&mut self, vcpu: usize) {
        self.offline.retain(|&v| v != vcpu);
        if !self.online.contains(&vcpu) {
            self.online.push(vcpu);
        }
    }

    /// `kvm_sched_out`: `vcpu` was descheduled (preempted or halted: ES2
    /// treats them alike).
    pub fn sched_out(&mut self, vcpu: usize) {
        self.online.retain(|&v| v != vcpu);
        self.offline.retain(|&v| v != vcpu);
        self.offline.push(vcpu);
        if self.sticky == Some(vcpu) {
            self.sticky = None;
        }
    }

    /// The vCPU an interrupt would go to now, without counting it: where
    /// ES2 points a VT-d posted-format IRTE (the hardware delivers without
    /// asking the hypervisor, so the choice is made at each schedule-in or
    /// -out instead of per interrupt).
    pub fn peek(&self, allowed: &[usize], index_of: impl Fn(usize) -> usize) -> Option<usize> {
        let ok = |v: &usize| allowed.contains(v);
        if let Some(s) = self.sticky.filter(|s| self.online.contains(s) && ok(s)) {
            return Some(s);
        }
        self.online
            .iter()
            .copied()
            .filter(ok)
            .min_by_key(|&v| (self.processed[index_of(v)], index_of(v)))
            .or_else(|| self.offline.iter().copied().find(|v| ok(v)))
    }

    /// The destination of a device interrupt the MSI aimed at `original`,
    /// among `allowed` (the MSI's lowest-priority set); `index_of` maps a
    /// vCPU to its index in the VM (for the counters, ties to the lowest).
    pub fn destination(
        &mut self,
        original: usize,
        allowed: &[usize],
        index_of: impl Fn(usize) -> usize,
    ) -> usize {
        let pick = match self.peek(allowed, &index_of) {
            // An online pick sticks until it is descheduled.
            Some(v) if self.online.contains(&v) => {
                self.sticky = Some(v);
                v
            }
            // The head of the offline list is a guess: not sticky.
            Some(v) => {
                self.to_offline += 1;
                v
            }
            None => original,
        };
        self.processed[index_of(pick)] += 1;
        if pick != original {
            self.redirected += 1;
        }
        pick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(v: usize) -> usize {
        v - 10
    }

    /// Online vCPUs win over the original destination, the least loaded
    /// first, and the pick sticks until it is descheduled.
    #[test]
    fn redirection_prefers_the_sticky_then_least_loaded_online_vcpu() {
        let all = [10, 11, 12, 13];
        let mut r = Redirect::new(&all);
        r.sched_in(12);
        r.sched_in(13);
        // vCPU 10 is offline: the interrupt goes to an online one, the
        // lowest index on a tie.
        assert_eq!(r.destination(10, &all, idx), 12);
        // Sticky, though 13 has processed fewer now.
        assert_eq!(r.destination(10, &all, idx), 12);
        assert_eq!(r.destination(10, &all, idx), 12);
        r.sched_out(12);
        // The least loaded online vCPU.
        assert_eq!(r.destination(10, &all, idx), 13);
        r.sched_in(12);
        // 13 is sticky now.
        assert_eq!(r.destination(10, &all, idx), 13);
        assert_eq!(r.redirected, 5);
    }

    /// With no vCPU online, the head of the offline list (descheduled
    /// longest) gets it, and that guess is not sticky.
    #[test]
    fn with_nothing_online_the_longest_descheduled_vcpu_gets_it() {
        let all = [10, 11, 12];
        let mut r = Redirect::new(&all);
        r.sched_in(11);
        r.sched_in(10);
        r.sched_out(11);
        r.sched_out(10);
        // Offline order: 12 (never ran), 11, 10.
        assert_eq!(r.destination(10, &all, idx), 12);
        r.sched_in(12);
        r.sched_out(12);
        assert_eq!(r.destination(10, &all, idx), 11);
        assert_eq!(r.to_offline, 2);
        // An online vCPU outside the MSI's set is never chosen.
        r.sched_in(12);
        assert_eq!(r.destination(10, &[10, 11], idx), 11);
    }
}
