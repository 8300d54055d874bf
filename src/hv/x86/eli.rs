//! ELI — ExitLess Interrupts (Gordon et al., ASPLOS '12), as the DID paper
//! (§3, Fig. 1, §2.2) and IBM's public KVM patch describe it
//! (`docs/papers.md`, ELI part and its section on IBM's public code).
//!
//! * **Shadow IDT** (docs/papers.md ELI §2.4): the guest's IDTR points at a copy of its
//!   IDT in which every vector from 0x20 up, except 0x80, is not present, so
//!   delivering a vector the guest does not own raises #NP; #NP is in the
//!   exception bitmap, so it exits. The gate of each *assigned* vector (the
//!   VF's host vector) is the guest's gate for its own vector.
//! * **Direct mode**: external-interrupt exiting off, EOI write passed
//!   through (x2APIC only), VMX preemption timer on. Assigned interrupts
//!   reach the guest's handler and are completed on the physical LAPIC.
//! * **Bounce**: a host vector's #NP exit re-raises it on the host (IBM's
//!   `recreate_intr`, a software `int`) and the host handler EOIs it.
//! * **Injection mode** (docs/papers.md ELI §2.6, DID Fig. 1): while any non-assigned
//!   (virtual) interrupt is pending or in service, the vCPU runs the stock
//!   KVM way: guest IDT, external-interrupt exiting on, EOI trapped. An
//!   assigned interrupt arriving meanwhile exits and is injected. Direct
//!   mode returns once the emulated LAPIC has nothing pending or in service
//!   (docs/papers.md ELI open point 3; IBM's code leaves at the first trapped EOI).
//! * **Protections** (docs/papers.md ELI §2.7): (1) the preemption timer regains the
//!   core even if the guest keeps IF = 0; (2) a direct EOI with nothing in
//!   service does nothing on the physical LAPIC; (3) host interrupts that
//!   target the core bounce through #NP ([`Critical::Bounce`], IBM's code),
//!   or host IPIs travel as NMIs, which exit unconditionally, with their
//!   vector left in a per-core mailbox ([`Critical::Nmi`], docs/papers.md ELI open point 5's
//!   default). The IDTR-limit variant is not modelled.
//!
//! The timer stays emulated (DID Table 1: "timer indirect"): TMICT writes
//! exit and every expiry is a virtual interrupt, i.e. an injection-mode
//! episode.

use super::kvm;
use super::vlapic;
use crate::hv::exits::ExitInfo;
use crate::hv::host::NmiMailbox;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::idt::{Idtr, ShadowIdt, NP_VECTOR};
use crate::hw::x86::lapic::{msr, ApicBitmap};

/// IBM's `preempt_timer` module parameter: 2.93e9 × 0.005 ticks ("5 ms at
/// 2.93 GHz"; the timer counts TSC >> 5, so it is longer in practice).
pub const DEFAULT_PREEMPTION_TIMER: u32 = 14_650_000;

/// How host interrupts aimed at a core running an ELI guest reach the
/// host (docs/papers.md ELI §2.7, protection 3).
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
pub enum Critical {
    /// Delivered as fixed interrupts; the shadow IDT's not-present gate
    /// turns each into a #NP exit (IBM's patch).
    #[default]
    Bounce,
    /// Host IPIs sent as NMIs with the vector in a mailbox: an NMI exits
    /// whatever the guest's IDT holds.
    Nmi,
}

/// The `eli` scheme.
#[derive(Clone, Debug)]
pub struct Eli {
    /// Protection 3's delivery of host interrupts.
    pub critical: Critical,
    /// Per core: host vectors sent to it as NMIs.
    mailbox: NmiMailbox,
    /// VMX-preemption timer value written before every direct-mode entry.
    pub preemption_timer_value: u32,
    /// Per vCPU: injection mode is on.
    injection: Vec<bool>,
    /// Switches into injection mode, for reports and tests.
    pub injection_episodes: u64,
    /// Host vectors bounced through #NP.
    pub bounces: u64,
}

impl Default for Eli {
    fn default() -> Self {
        Eli {
            critical: Critical::Bounce,
            mailbox: NmiMailbox::default(),
            preemption_timer_value: DEFAULT_PREEMPTION_TIMER,
            injection: Vec::new(),
            injection_episodes: 0,
            bounces: 0,
        }
    }
}

impl Eli {
    /// ELI with protection 3 done by `critical`.
    pub fn new(critical: Critical) -> Self {
        Eli {
            critical,
            ..Eli::default()
        }
    }

    /// Whether `vcpu` is in injection mode.
    pub fn in_injection_mode(&self, vcpu: usize) -> bool {
        self.injection.get(vcpu).copied().unwrap_or(false)
    }

    /// `eli_set_inject_mode(false)`: shadow IDT, #NP trapped, no
    /// external-interrupt exiting, EOI passed through, preemption timer on.
    fn direct_mode(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.injection[vcpu] = false;
        let vmcs = &mut cx.m.vmcs[vcpu];
        vmcs.guest_idtr = Idtr::Shadow;
        vmcs.exception_bitmap |= 1 << NP_VECTOR;
        vmcs.pin.ext_int_exiting = false;
        vmcs.pin.preemption_timer = true;
        vmcs.preemption_timer_value = self.preemption_timer_value;
        let _ = vmcs.msr_bitmap.set_write_intercept(msr::EOI, false);
    }

    /// `eli_set_inject_mode(true)`: the guest's own IDT and stock KVM
    /// controls, so injected interrupts and their EOIs stay consistent.
    fn injection_mode(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.injection[vcpu] = true;
        self.injection_episodes += 1;
        let vmcs = &mut cx.m.vmcs[vcpu];
        vmcs.guest_idtr = Idtr::Guest;
        vmcs.exception_bitmap &= !(1 << NP_VECTOR);
        vmcs.pin.ext_int_exiting = true;
        vmcs.pin.preemption_timer = false;
        let _ = vmcs.msr_bitmap.set_write_intercept(msr::EOI, true);
    }
}

impl Scheme for Eli {
    fn name(&self) -> &'static str {
        "eli"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        // Stock KVM's VMCS, and the VF's MSI-X as a host IRQ on the VM's
        // core: ELI leaves the IRTE alone and remaps through the IDT.
        kvm::setup(cx, vm);
        self.injection.resize(cx.hv.vcpus.len(), false);
        self.mailbox.resize(cx.m.lapics.len());
        let vf = cx.hv.vms[vm].vf;
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            // DI_INITIALIZE + DI_START: copy the guest's gates, clear the
            // present bit from 0x20 up except the syscall gate 0x80, then
            // give each assigned host vector the guest's gate.
            let mut shadow = ShadowIdt::copy_of_guest();
            for v in 0x20..=0xFFu8 {
                if v != 0x80 {
                    shadow.mark_not_present(v);
                }
            }
            if let Some(a) = vf {
                shadow.copy_gate(a.host_vector, a.guest_vector);
            }
            cx.m.shadow_idt[vcpu] = shadow;
            self.direct_mode(cx, vcpu);
        }
    }

    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        let core = cx.hv.vcpus[vcpu].core;
        match info {
            ExitInfo::Exception {
                vector: NP_VECTOR,
                idt_vectoring: Some(v),
            } => {
                // eli_complete_interrupts: the faulting delivery was a host
                // vector; re-raise it on the host, whose handler EOIs it.
                self.bounces += 1;
                self.host_interrupt(cx, core, v);
                cx.m.lapics[core].eoi();
                ExitOutcome::default()
            }
            ExitInfo::MsrWrite { msr: msr::EOI, .. } if self.in_injection_mode(vcpu) => {
                // The guest completes the highest interrupt it has in
                // service; with mixed delivery that may be a directly
                // delivered one in the physical ISR (seen through the
                // shadow IDT) rather than an injected one.
                let phys = cx.m.lapics[core]
                    .isr
                    .highest()
                    .and_then(|p| cx.m.shadow_idt[vcpu].gate(p));
                let emulated = cx.hv.vcpus[vcpu].vlapic.isr.highest();
                if phys.is_some() && phys > emulated {
                    let cleared = cx.m.lapics[core].eoi();
                    return ExitOutcome {
                        eoi_cleared: Some(cleared.and_then(|c| cx.m.shadow_idt[vcpu].gate(c))),
                    };
                }
                kvm::exit(self, cx, vcpu, info)
            }
            _ => kvm::exit(self, cx, vcpu, info),
        }
    }

    /// Directly delivered interrupts are completed on the physical LAPIC,
    /// whose ISR the host can neither save nor restore: a vCPU is
    /// scheduled out only with nothing in service there, or the next
    /// thread on the core would inherit it (as DID, docs/papers.md DID
    /// open point 4; ELI assumes a core per vCPU and is silent).
    fn preemptible(&self, cx: &HvCx, vcpu: usize) -> bool {
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.lapics[core].isr.is_empty()
    }

    /// Protection 3 with [`Critical::Nmi`]: a host IPI to a core that runs
    /// an ELI guest leaves its vector in the core's mailbox and travels as
    /// an NMI (NMI exiting is on in both modes, as in stock KVM).
    fn send_host_ipi(&mut self, cx: &mut HvCx, from: usize, to: usize, vector: u8) {
        let as_nmi = self.critical == Critical::Nmi && cx.hv.vcpu_on(to).is_some();
        self.mailbox.send(cx, from, to, vector, as_nmi);
    }

    /// The NMI handler runs the host handlers of the mailbox's vectors.
    fn host_nmi(&mut self, cx: &mut HvCx, core: usize) {
        cx.charge(cx.costs.irq_handler);
        let mb = self.mailbox.take(core);
        for &v in &mb {
            self.host_idt(cx, core, v);
        }
        self.mailbox.give_back(core, mb);
    }

    fn reset_metrics(&mut self) {
        self.bounces = 0;
        self.injection_episodes = 0;
        self.mailbox.sent = 0;
    }

    fn metrics(&self, out: &mut crate::guest::app::Metrics) {
        out.insert("eli.bounces".into(), self.bounces as f64);
        out.insert(
            "eli.injection_episodes".into(),
            self.injection_episodes as f64,
        );
        out.insert("eli.critical_nmis".into(), self.mailbox.sent as f64);
    }

    /// KVM's injection, and the mode switch around it: inject, then run in
    /// injection mode while the emulated LAPIC holds anything; otherwise
    /// direct mode.
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        vlapic::inject_pending(cx, vcpu);
        let vl = &cx.hv.vcpus[vcpu].vlapic;
        let vmcs = &cx.m.vmcs[vcpu];
        let virtual_work = vmcs.entry_event.is_some()
            || vmcs.proc.interrupt_window_exiting
            || !vl.irr.is_empty()
            || !vl.isr.is_empty();
        match (virtual_work, self.in_injection_mode(vcpu)) {
            (true, false) => self.injection_mode(cx, vcpu),
            (false, true) => self.direct_mode(cx, vcpu),
            _ => {}
        }
    }

    /// What the guest has in service: the injected vectors in the emulated
    /// LAPIC plus the directly delivered ones in the physical ISR, as the
    /// shadow IDT maps them.
    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        let core = cx.hv.vcpus[vcpu].core;
        let mut isr = cx.m.shadow_idt[vcpu].guest_view(&cx.m.lapics[core].isr);
        isr.union_with(&cx.hv.vcpus[vcpu].vlapic.isr);
        isr
    }
}
