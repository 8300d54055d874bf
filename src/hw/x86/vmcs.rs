//! The VMX controls of one vCPU (Intel SDM Vol. 3, ch. 24 "Virtual Machine
//! Control Structures" and ch. 25 "VMX Non-Root Operation").
//!
//! Only the controls that decide whether an interrupt-related event exits or
//! stays in the guest are modelled: the pin-based, primary and secondary
//! processor-based and VM-exit controls that bear on interrupts, the MSR
//! bitmap in its architectural byte layout, the exception bitmap, the
//! posted-interrupt notification vector, the EOI-exit bitmap and the guest
//! interrupt status (RVI/SVI). Questions a delivery scheme asks ("does this
//! WRMSR exit?") are answered the way the processor would answer them.

use crate::hw::x86::lapic::{msr as apic_msr, ApicBitmap};

/// IA32_VMX_MISC[4:0] of the modelled CPU: the VMX-preemption timer counts
/// down by one every 2^5 TSC ticks (SDM 25.5.1).
pub const PREEMPTION_TIMER_RATE: u32 = 5;

/// Pin-based VM-execution controls (SDM 24.6.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinControls {
    /// External interrupts cause VM exits instead of going through the guest IDT.
    pub ext_int_exiting: bool,
    /// NMIs cause VM exits.
    pub nmi_exiting: bool,
    /// NMIs are never blocked in the guest; the VMM tracks virtual-NMI blocking.
    pub virtual_nmis: bool,
    /// The VMX-preemption timer counts down in non-root operation and exits at 0.
    pub preemption_timer: bool,
    /// Interrupts with the posted-interrupt notification vector are processed
    /// by the processor into the virtual APIC instead of exiting.
    pub posted_interrupts: bool,
}

/// Primary processor-based VM-execution controls (SDM 24.6.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcControls {
    /// HLT causes a VM exit.
    pub hlt_exiting: bool,
    /// Exit at the start of any instruction where RFLAGS.IF = 1 and nothing blocks interrupts.
    pub interrupt_window_exiting: bool,
    /// Exit at the start of any instruction where virtual-NMI blocking is off.
    pub nmi_window_exiting: bool,
    /// MSR bitmaps decide which RDMSR/WRMSR exit; without them all do.
    pub use_msr_bitmaps: bool,
    /// Every IN/OUT exits (KVM does not use I/O bitmaps).
    pub unconditional_io_exiting: bool,
    /// A virtual-APIC page shadows the TPR (prerequisite of APIC virtualization).
    pub use_tpr_shadow: bool,
}

/// Secondary processor-based VM-execution controls (SDM 24.6.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Proc2Controls {
    /// "Virtualize APIC accesses" (SDM 29.4): guest accesses to the
    /// APIC-access page (an xAPIC guest's LAPIC MMIO) exit as APIC_ACCESS,
    /// unless APIC-register virtualization takes them.
    pub virtualize_apic_accesses: bool,
    /// x2APIC MSR accesses that do not exit go to the virtual-APIC page.
    pub virtualize_x2apic: bool,
    /// Reads of APIC registers are served from the virtual-APIC page.
    pub apic_register_virtualization: bool,
    /// The processor evaluates and delivers virtual interrupts (RVI/SVI) itself.
    pub virtual_interrupt_delivery: bool,
    /// Tertiary control "IPI virtualization" (SDM 30.1.6): unicast fixed
    /// physical-mode ICR writes are posted by the processor through the
    /// PID-pointer table.
    pub ipi_virtualization: bool,
    /// Tertiary control bit 8, "APIC-timer virtualization" (Intel ISE
    /// 319433-059 ch. 8; Linux `TERTIARY_EXEC_GUEST_APIC_TIMER`): with
    /// virtual-interrupt delivery, a guest WRMSR of IA32_TSC_DEADLINE that
    /// the MSR bitmap does not intercept arms the VMCS's guest deadline,
    /// and its expiry in non-root operation raises the virtual timer
    /// vector in the virtual-APIC page (no exit either way).
    pub apic_timer_virtualization: bool,
}

/// Where an xAPIC guest's LAPIC MMIO write goes (SDM 29.4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApicMmioOutcome {
    /// APIC-access VM exit (fault-like: KVM decodes and emulates the store).
    ApicAccessExit,
    /// Written to the virtual-APIC page, then an APIC-write VM exit
    /// (trap-like: KVM emulates the register from the page).
    ApicWriteExit,
    /// EOI virtualization.
    EoiVirtualization,
    /// TPR virtualization.
    TprVirtualization,
    /// IPI virtualization (processor posts the IPI).
    IpiVirtualization,
}

/// VM-exit controls (SDM 24.7.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitControls {
    /// On an external-interrupt exit the processor acknowledges the interrupt
    /// controller and saves the vector in the exit-information field (SDM
    /// 27.2.2); when clear, the interrupt stays requested in the LAPIC until
    /// the host enables interrupts.
    pub ack_interrupt_on_exit: bool,
}

/// VM-entry interruption-information field: an event injected at the next entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryEvent {
    /// An external interrupt with its vector.
    ExternalInterrupt(u8),
    /// A non-maskable interrupt (vector 2).
    Nmi,
}

/// What a guest WRMSR does in VMX non-root operation (SDM 25.1.3 for the
/// exit, 29.5 for the x2APIC registers the processor virtualizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrmsrOutcome {
    /// It causes a VM exit (no MSR bitmaps, or its write bit is set).
    VmExit,
    /// TPR (808H) with "virtualize x2APIC mode": the value goes to VTPR on
    /// the virtual-APIC page, then TPR virtualization (SDM 29.1.2).
    TprVirtualization,
    /// EOI (80BH) with "virtualize x2APIC mode" and "virtual-interrupt
    /// delivery": EOI virtualization on the virtual-APIC page (SDM 29.1.4).
    EoiVirtualization,
    /// SELF IPI (83FH) with "virtualize x2APIC mode" and "virtual-interrupt
    /// delivery": self-IPI virtualization, vIRR and RVI (SDM 29.1.5).
    SelfIpiVirtualization,
    /// ICR (830H) with "virtualize x2APIC mode", "virtual-interrupt
    /// delivery" and "IPI virtualization": the processor sends a unicast
    /// fixed physical-mode IPI through the PID-pointer table; any other
    /// ICR value causes an APIC-write VM exit (SDM 30.1.6).
    IpiVirtualization,
    /// IA32_TSC_DEADLINE (6E0H) with "APIC-timer virtualization" (and
    /// "virtual-interrupt delivery"): the value goes to the guest deadline
    /// shadow and, in host-TSC terms, the guest deadline (ISE ch. 8); the
    /// physical LAPIC timer is not touched.
    TscDeadlineVirtualization,
    /// The MSR itself is written: for an x2APIC register, the processor's
    /// own LAPIC.
    Msr,
}

/// Size of the MSR bitmap page.
const MSR_BITMAP_BYTES: usize = 4096;
/// Offset of the read bitmap for low MSRs 0..=0x1FFF.
const READ_LOW: usize = 0;
/// Offset of the read bitmap for high MSRs 0xC000_0000..=0xC000_1FFF.
const READ_HIGH: usize = 1024;
/// Offset of the write bitmap for low MSRs.
const WRITE_LOW: usize = 2048;
/// Offset of the write bitmap for high MSRs.
const WRITE_HIGH: usize = 3072;

/// The 4-KiB MSR bitmap in its architectural layout: read-low (MSRs 0..=0x1FFF) at byte 0, read-high (0xC000_0000..=0xC000_1FFF) at 1024, write-low at 2048, write-high at 3072. Bit set = the access exits. MSRs outside both ranges always exit.
#[derive(Clone, PartialEq, Eq)]
pub struct MsrBitmap {
    bytes: Box<[u8; MSR_BITMAP_BYTES]>,
}

impl MsrBitmap {
    /// Every covered MSR exits on read and write.
    pub fn intercept_all() -> Self {
        MsrBitmap {
            bytes: Box::new([0xFF; MSR_BITMAP_BYTES]),
        }
    }

    /// No covered MSR exits (MSRs outside the covered ranges still do).
    pub fn intercept_none() -> Self {
        MsrBitmap {
            bytes: Box::new([0; MSR_BITMAP_BYTES]),
        }
    }

    /// The byte and bit that govern reading (or `write`-ing) `msr`; None
    /// outside the covered ranges.
    fn locate(msr: u32, write: bool) -> Option<(usize, u8)> {
        let base = match (msr, write) {
            (0..=0x1FFF, false) => READ_LOW,
            (0..=0x1FFF, true) => WRITE_LOW,
            (0xC000_0000..=0xC000_1FFF, false) => READ_HIGH,
            (0xC000_0000..=0xC000_1FFF, true) => WRITE_HIGH,
            _ => return None,
        };
        let off = (msr & 0x1FFF) as usize;
        Some((base + off / 8, 1 << (off % 8)))
    }

    fn set(&mut self, msr: u32, write: bool, on: bool) -> Result<(), VmcsError> {
        let (byte, bit) = Self::locate(msr, write).ok_or(VmcsError::MsrOutOfRange(msr))?;
        if on {
            self.bytes[byte] |= bit;
        } else {
            self.bytes[byte] &= !bit;
        }
        Ok(())
    }

    fn exits(&self, msr: u32, write: bool) -> bool {
        Self::locate(msr, write).is_none_or(|(byte, bit)| self.bytes[byte] & bit != 0)
    }

    /// Makes RDMSR of `msr` exit (`on`) or not.
    pub fn set_read_intercept(&mut self, msr: u32, on: bool) -> Result<(), VmcsError> {
        self.set(msr, false, on)
    }

    /// Makes WRMSR of `msr` exit (`on`) or not.
    pub fn set_write_intercept(&mut self, msr: u32, on: bool) -> Result<(), VmcsError> {
        self.set(msr, true, on)
    }

    /// Whether RDMSR of `msr` exits by this bitmap (always, outside its ranges).
    pub fn read_exits(&self, msr: u32) -> bool {
        self.exits(msr, false)
    }

    /// Whether WRMSR of `msr` exits by this bitmap (always, outside its ranges).
    pub fn write_exits(&self, msr: u32) -> bool {
        self.exits(msr, true)
    }

    /// The page as the processor reads it.
    pub fn as_bytes(&self) -> &[u8; 4096] {
        &self.bytes
    }
}

impl Default for MsrBitmap {
    /// Intercept everything: the safe state of a fresh page.
    fn default() -> Self {
        Self::intercept_all()
    }
}

impl std::fmt::Debug for MsrBitmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // 4 KiB of bytes would drown any Debug output; count what passes through.
        let clear =
            |r: std::ops::Range<usize>| self.bytes[r].iter().map(|b| b.count_zeros()).sum::<u32>();
        f.debug_struct("MsrBitmap")
            .field("read_passthrough", &(clear(READ_LOW..WRITE_LOW)))
            .field("write_passthrough", &(clear(WRITE_LOW..MSR_BITMAP_BYTES)))
            .finish()
    }
}

/// A VM-entry check the controls fail (the entry would fail with
/// "invalid control field(s)").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmcsError {
    /// The MSR bitmap cannot express an intercept for this MSR.
    #[error("MSR {0:#x} is outside the ranges an MSR bitmap covers")]
    MsrOutOfRange(u32),
    /// SDM 26.2.1.1: "virtual NMIs" needs "NMI exiting".
    #[error("virtual NMIs require NMI exiting")]
    VirtualNmisWithoutNmiExiting,
    /// SDM 26.2.1.1: "NMI-window exiting" needs "virtual NMIs".
    #[error("NMI-window exiting requires virtual NMIs")]
    NmiWindowWithoutVirtualNmis,
    /// SDM 26.2.1.1: x2APIC virtualization, APIC-register virtualization and
    /// virtual-interrupt delivery all need "use TPR shadow".
    #[error("x2APIC virtualization, APIC-register virtualization and virtual-interrupt delivery require use TPR shadow")]
    ApicVirtualizationWithoutTprShadow,
    /// SDM 26.2.1.1: "virtual-interrupt delivery" needs "external-interrupt exiting".
    #[error("virtual-interrupt delivery requires external-interrupt exiting")]
    VirtualInterruptDeliveryWithoutExtIntExiting,
    /// SDM 26.2.1.1: "process posted interrupts" needs "virtual-interrupt delivery".
    #[error("posted interrupts require virtual-interrupt delivery")]
    PostedInterruptsWithoutVirtualInterruptDelivery,
    /// SDM 26.2.1.1: "process posted interrupts" needs "acknowledge interrupt on exit".
    #[error("posted interrupts require acknowledge interrupt on exit")]
    PostedInterruptsWithoutAckOnExit,
    /// ISE 319433-059 ch. 8: "APIC-timer virtualization" needs
    /// "virtual-interrupt delivery" (KVM clears the bit without it).
    #[error("APIC-timer virtualization requires virtual-interrupt delivery")]
    ApicTimerVirtualizationWithoutVirtualInterruptDelivery,
}

/// Exception vectors KVM intercepts with EPT on: #DB (1), #UD (6), #AC (17), #MC (18).
const KVM_EXCEPTION_BITMAP: u32 = (1 << 1) | (1 << 6) | (1 << 17) | (1 << 18);
/// MSRs KVM passes through to every guest: SYSENTER_CS/ESP/EIP, FS_BASE,
/// GS_BASE, KERNEL_GS_BASE.
const KVM_PASSTHROUGH_MSRS: [u32; 6] = [0x174, 0x175, 0x176, 0xC000_0100, 0xC000_0101, 0xC000_0102];
/// The posted-interrupt notification vector Linux reserves for KVM.
pub const KVM_POSTED_INTR_VECTOR: u8 = 0xF2;

/// The VMX controls of one vCPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Vmcs {
    /// Pin-based controls.
    pub pin: PinControls,
    /// Primary processor-based controls.
    pub proc: ProcControls,
    /// Secondary processor-based controls.
    pub proc2: Proc2Controls,
    /// VM-exit controls.
    pub exit: ExitControls,
    /// Which RDMSR/WRMSR exit when `use_msr_bitmaps` is on.
    pub msr_bitmap: MsrBitmap,
    /// Bit n set: exception vector n exits.
    pub exception_bitmap: u32,
    /// VMX-preemption timer value, counted down while the timer control is on.
    pub preemption_timer_value: u32,
    /// The event the next VM entry injects, if any.
    pub entry_event: Option<EntryEvent>,
    /// With virtual-interrupt delivery, EOIs of vectors set here exit
    /// (so the VMM can forward level-triggered EOIs).
    pub eoi_exit_bitmap: ApicBitmap,
    /// The posted-interrupt notification vector.
    pub posted_intr_nv: u8,
    /// guest interrupt status (RVI, SVI) for virtual-interrupt delivery
    /// — RVI: the highest virtual interrupt requested.
    pub rvi: u8,
    /// SVI: the highest virtual interrupt in service.
    pub svi: u8,
    /// Guest-state IDTR: the guest's own IDT or the hypervisor's shadow copy.
    pub guest_idtr: super::idt::Idtr,
    /// PID-pointer table (IPI virtualization): entry i is the index of the
    /// posted-interrupt descriptor of the vCPU whose APIC ID is i; its
    /// length is the last PID-pointer index + 1.
    pub pid_table: Vec<u16>,
    /// Virtual timer vector (16-bit control field 000AH,
    /// `GUEST_APIC_TIMER_VECTOR`): the vector APIC-timer virtualization
    /// raises on expiry.
    pub virtual_timer_vector: u8,
    /// Guest deadline (64-bit guest-state field 2830H,
    /// `GUEST_DEADLINE_PHY`): the host TSC value at which the virtual timer
    /// expires; 0 = disarmed. The processor clears it when it fires.
    pub guest_deadline: u64,
    /// Guest deadline shadow (64-bit control field 204EH,
    /// `GUEST_DEADLINE_VIR`): the deadline as the guest wrote it (its TSC,
    /// offset and scaling applied); what a guest RDMSR of the deadline
    /// returns.
    pub guest_deadline_shadow: u64,
}

impl Vmcs {
    /// What KVM sets up for a plain vCPU without APICv: external-interrupt exiting on, NMI exiting on, ack-interrupt-on-exit on, HLT exiting on, MSR bitmaps on with every x2APIC register (0x800..=0x8FF) intercepted for read and write, and TSC_DEADLINE 0x6E0 intercepted.
    ///
    /// Every other MSR is intercepted too, except the few KVM always passes
    /// through (SYSENTER_*, FS/GS bases); the exception bitmap is KVM's with
    /// EPT (#DB, #UD, #AC, #MC).
    pub fn kvm_default() -> Self {
        let mut msr_bitmap = MsrBitmap::intercept_all();
        for m in KVM_PASSTHROUGH_MSRS {
            // These all lie in covered ranges.
            let _ = msr_bitmap.set_read_intercept(m, false);
            let _ = msr_bitmap.set_write_intercept(m, false);
        }
        Vmcs {
            pin: PinControls {
                ext_int_exiting: true,
                nmi_exiting: true,
                virtual_nmis: true,
                ..PinControls::default()
            },
            proc: ProcControls {
                hlt_exiting: true,
                use_msr_bitmaps: true,
                unconditional_io_exiting: true,
                ..ProcControls::default()
            },
            exit: ExitControls {
                ack_interrupt_on_exit: true,
            },
            msr_bitmap,
            exception_bitmap: KVM_EXCEPTION_BITMAP,
            ..Vmcs::default()
        }
    }

    /// What KVM sets up with APICv and posted interrupts: [`kvm_default`]
    /// plus use TPR shadow, x2APIC virtualization, APIC-register
    /// virtualization, virtual-interrupt delivery and posted interrupts with
    /// notification vector 0xF2. x2APIC register reads pass through except
    /// TMCCT (the current count lives in the VMM); writes of TPR, EOI and
    /// SELF IPI are not intercepted, so the processor virtualizes them on
    /// the virtual-APIC page ([`wrmsr_outcome`](Self::wrmsr_outcome));
    /// everything else (ICR, timer) still exits.
    ///
    /// [`kvm_default`]: Self::kvm_default
    pub fn kvm_apicv() -> Self {
        let mut v = Self::kvm_default();
        v.pin.posted_interrupts = true;
        v.proc.use_tpr_shadow = true;
        v.proc2 = Proc2Controls {
            virtualize_apic_accesses: false,
            virtualize_x2apic: true,
            apic_register_virtualization: true,
            virtual_interrupt_delivery: true,
            ipi_virtualization: false,
            apic_timer_virtualization: false,
        };
        v.posted_intr_nv = KVM_POSTED_INTR_VECTOR;
        for m in apic_msr::X2APIC_RANGE {
            let _ = v.msr_bitmap.set_read_intercept(m, m == apic_msr::TMCCT);
        }
        for m in [apic_msr::TPR, apic_msr::EOI, apic_msr::SELF_IPI] {
            let _ = v.msr_bitmap.set_write_intercept(m, false);
        }
        v
    }

    /// `vmx_set_virtual_apic_mode`: an xAPIC guest gets "virtualize APIC
    /// accesses" (its LAPIC page becomes the APIC-access page) instead of
    /// "virtualize x2APIC mode"; the other APICv controls stay as they are.
    pub fn set_virtual_apic_mode(&mut self, xapic: bool) {
        if xapic {
            self.proc2.virtualize_apic_accesses = true;
            self.proc2.virtualize_x2apic = false;
        }
    }

    /// Whether WRMSR of `msr` in the guest exits: always without MSR bitmaps,
    /// otherwise as the bitmap says.
    pub fn msr_write_exits(&self, msr: u32) -> bool {
        !self.proc.use_msr_bitmaps || self.msr_bitmap.write_exits(msr)
    }

    /// Where a guest WRMSR of `msr` goes: a VM exit if the bitmap says so;
    /// otherwise, with "virtualize x2APIC mode", TPR writes and (with
    /// virtual-interrupt delivery) EOI and SELF IPI writes are virtualized
    /// on the virtual-APIC page (SDM 29.5); anything else writes the MSR.
    pub fn wrmsr_outcome(&self, msr: u32) -> WrmsrOutcome {
        if self.msr_write_exits(msr) {
            return WrmsrOutcome::VmExit;
        }
        let p2 = self.proc2;
        match msr {
            apic_msr::TPR if p2.virtualize_x2apic => WrmsrOutcome::TprVirtualization,
            apic_msr::EOI if p2.virtualize_x2apic && p2.virtual_interrupt_delivery => {
                WrmsrOutcome::EoiVirtualization
            }
            apic_msr::SELF_IPI if p2.virtualize_x2apic && p2.virtual_interrupt_delivery => {
                WrmsrOutcome::SelfIpiVirtualization
            }
            apic_msr::ICR
                if p2.virtualize_x2apic
                    && p2.virtual_interrupt_delivery
                    && p2.ipi_virtualization =>
            {
                WrmsrOutcome::IpiVirtualization
            }
            apic_msr::TSC_DEADLINE
                if p2.apic_timer_virtualization && p2.virtual_interrupt_delivery =>
            {
                WrmsrOutcome::TscDeadlineVirtualization
            }
            _ => WrmsrOutcome::Msr,
        }
    }

    /// APIC-timer virtualization of a guest WRMSR of IA32_TSC_DEADLINE
    /// (ISE 319433-059 §8.2): the guest deadline shadow takes the value
    /// and the guest deadline its host-TSC equivalent (the model's guests
    /// run with TSC offset 0 and no scaling, so the same value; 0
    /// disarms). Returns the guest deadline now armed (0: none).
    pub fn write_guest_deadline(&mut self, value: u64) -> u64 {
        self.guest_deadline_shadow = value;
        self.guest_deadline = value;
        value
    }

    /// The virtual timer's expiry check (ISE §8.3), made in VMX non-root
    /// operation and at VM entry: when the guest deadline is armed and the
    /// host TSC has reached it, the processor disarms it (guest deadline
    /// and shadow := 0) and returns the virtual timer vector, which it
    /// then raises in the virtual-APIC page (`VirtualApic::timer_fire`).
    pub fn guest_deadline_expired(&mut self, host_tsc: u64) -> Option<u8> {
        if !self.proc2.apic_timer_virtualization
            || self.guest_deadline == 0
            || host_tsc < self.guest_deadline
        {
            return None;
        }
        self.guest_deadline = 0;
        self.guest_deadline_shadow = 0;
        Some(self.virtual_timer_vector)
    }

    /// Where an xAPIC guest's store to its LAPIC page at `offset` goes
    /// (SDM 29.4.3): with "virtualize APIC accesses" alone, every write is
    /// an APIC-access exit (a TPR write with the TPR shadow is
    /// virtualized); with APIC-register virtualization too, TPR and (with
    /// virtual-interrupt delivery) EOI writes are virtualized, ICR-low
    /// writes are posted under IPI virtualization, the other registers the
    /// SDM lists are written to the virtual-APIC page and then exit as
    /// APIC_WRITE (trap-like), and the rest exit as APIC_ACCESS.
    pub fn apic_mmio_write_outcome(&self, offset: u16) -> ApicMmioOutcome {
        let p2 = self.proc2;
        if !p2.virtualize_apic_accesses {
            // No APIC-access page: the access faults in EPT and KVM
            // emulates the MMIO, an exit as well.
            return ApicMmioOutcome::ApicAccessExit;
        }
        if !p2.apic_register_virtualization {
            return if offset == 0x80 && self.proc.use_tpr_shadow {
                ApicMmioOutcome::TprVirtualization
            } else {
                ApicMmioOutcome::ApicAccessExit
            };
        }
        match offset {
            0x80 => ApicMmioOutcome::TprVirtualization,
            0xB0 if p2.virtual_interrupt_delivery => ApicMmioOutcome::EoiVirtualization,
            0x300 if p2.virtual_interrupt_delivery && p2.ipi_virtualization => {
                ApicMmioOutcome::IpiVirtualization
            }
            0xB0 | 0xD0 | 0xE0 | 0xF0 | 0x280 | 0x300 | 0x310 | 0x320..=0x370 | 0x380 | 0x3E0 => {
                ApicMmioOutcome::ApicWriteExit
            }
            _ => ApicMmioOutcome::ApicAccessExit,
        }
    }

    /// Whether RDMSR of `msr` in the guest exits: always without MSR bitmaps,
    /// otherwise as the bitmap says.
    pub fn msr_read_exits(&self, msr: u32) -> bool {
        !self.proc.use_msr_bitmaps || self.msr_bitmap.read_exits(msr)
    }

    /// Would a maskable external interrupt arriving in guest mode cause a VM exit? (= pin.ext_int_exiting)
    ///
    /// With posted interrupts, one carrying the notification vector does not
    /// exit; see [`posted_notification_absorbed`](Self::posted_notification_absorbed).
    pub fn external_interrupt_exits(&self) -> bool {
        self.pin.ext_int_exiting
    }

    /// Whether an external interrupt with `vector` arriving in guest mode is
    /// taken as a posted-interrupt notification instead of exiting.
    pub fn posted_notification_absorbed(&self, vector: u8) -> bool {
        self.pin.posted_interrupts && vector == self.posted_intr_nv
    }

    /// Whether an NMI arriving in guest mode causes a VM exit.
    pub fn nmi_exits(&self) -> bool {
        self.pin.nmi_exiting
    }

    /// Whether exception `vector` raised in the guest exits (its exception
    /// bitmap bit; vectors above 31 are not exceptions and never exit).
    pub fn exception_exits(&self, vector: u8) -> bool {
        vector < 32 && self.exception_bitmap & (1 << vector) != 0
    }

    /// The SDM's VM-entry control checks (26.2.1.1) that bear on the
    /// controls modelled here; the first one failed is returned.
    pub fn check_entry(&self) -> Result<(), VmcsError> {
        if self.pin.virtual_nmis && !self.pin.nmi_exiting {
            return Err(VmcsError::VirtualNmisWithoutNmiExiting);
        }
        if self.proc.nmi_window_exiting && !self.pin.virtual_nmis {
            return Err(VmcsError::NmiWindowWithoutVirtualNmis);
        }
        let p2 = self.proc2;
        if !self.proc.use_tpr_shadow
            && (p2.virtualize_x2apic
                || p2.apic_register_virtualization
                || p2.virtual_interrupt_delivery)
        {
            return Err(VmcsError::ApicVirtualizationWithoutTprShadow);
        }
        if p2.virtual_interrupt_delivery && !self.pin.ext_int_exiting {
            return Err(VmcsError::VirtualInterruptDeliveryWithoutExtIntExiting);
        }
        if p2.apic_timer_virtualization && !p2.virtual_interrupt_delivery {
            return Err(VmcsError::ApicTimerVirtualizationWithoutVirtualInterruptDelivery);
        }
        if self.pin.posted_interrupts {
            if !p2.virtual_interrupt_delivery {
                return Err(VmcsError::PostedInterruptsWithoutVirtualInterruptDelivery);
            }
            if !self.exit.ack_interrupt_on_exit {
                return Err(VmcsError::PostedInterruptsWithoutAckOnExit);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    /// SDM 29.4.3: what an xAPIC guest's LAPIC stores do under stock KVM
    /// (APIC-access page only) and under APICv (register virtualization and
    /// virtual-interrupt delivery).
    #[test]
    fn xapic_stores_exit_or_are_virtualized_as_the_controls_say() {
        let mut kvm = Vmcs::kvm_default();
        kvm.set_virtual_apic_mode(true);
        assert!(kvm.proc2.virtualize_apic_accesses);
        for off in [0xB0, 0x380, 0x320, 0x300] {
            assert_eq!(
                kvm.apic_mmio_write_outcome(off),
                ApicMmioOutcome::ApicAccessExit
            );
        }
        let mut v = Vmcs::kvm_apicv();
        v.set_virtual_apic_mode(true);
        assert!(
            !v.proc2.virtualize_x2apic,
            "x2APIC virtualization off for xAPIC"
        );
        assert_eq!(
            v.apic_mmio_write_outcome(0xB0),
            ApicMmioOutcome::EoiVirtualization
        );
        assert_eq!(
            v.apic_mmio_write_outcome(0x80),
            ApicMmioOutcome::TprVirtualization
        );
        assert_eq!(
            v.apic_mmio_write_outcome(0x380),
            ApicMmioOutcome::ApicWriteExit
        );
        assert_eq!(
            v.apic_mmio_write_outcome(0x300),
            ApicMmioOutcome::ApicWriteExit
        );
        assert_eq!(
            v.apic_mmio_write_outcome(0x020),
            ApicMmioOutcome::ApicAccessExit
        );
        v.proc2.ipi_virtualization = true;
        assert_eq!(
            v.apic_mmio_write_outcome(0x300),
            ApicMmioOutcome::IpiVirtualization
        );
        // An x2APIC guest's VMCS is untouched.
        let mut x2 = Vmcs::kvm_apicv();
        x2.set_virtual_apic_mode(false);
        assert_eq!(x2, Vmcs::kvm_apicv());
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn intercept_all_sets_every_bit() {
        let b = MsrBitmap::intercept_all();
        assert!(b.as_bytes().iter().all(|x| *x == 0xFF));
        assert!(b.read_exits(0) && b.write_exits(0xC000_1FFF));
        assert_eq!(MsrBitmap::default(), b);
    }

    #[test]
    fn eoi_write_bit_sits_in_write_low_half() {
        let mut b = MsrBitmap::intercept_none();
        assert_eq!(b.set_write_intercept(apic_msr::EOI, true), Ok(()));
        let byte = 2048 + 0x80B / 8;
        let bit = 1u8 << (0x80B % 8);
        for (i, x) in b.as_bytes().iter().enumerate() {
            assert_eq!(*x, if i == byte { bit } else { 0 }, "byte {i}");
        }
        assert!(b.write_exits(apic_msr::EOI));
        assert!(
            !b.read_exits(apic_msr::EOI),
            "reads are governed by another bit"
        );
        assert!(!b.write_exits(0x80A) && !b.write_exits(0x80C));
        b.set_write_intercept(apic_msr::EOI, false).ok();
        assert!(b.as_bytes().iter().all(|x| *x == 0));
    }

    #[test]
    fn each_quarter_of_the_page() {
        let cases = [
            (0x10u32, false, 0x10 / 8, 0x10 % 8),
            (0x1FFF, false, 1023, 7),
            (0xC000_0080, false, 1024 + 0x80 / 8, 0),
            (0x6E0, true, 2048 + 0x6E0 / 8, 0),
            (0xC000_0101, true, 3072 + 0x101 / 8, 0x101 % 8),
            (0xC000_1FFF, true, 4095, 7),
        ];
        for (msr, write, byte, bit) in cases {
            let mut b = MsrBitmap::intercept_none();
            let r = if write {
                b.set_write_intercept(msr, true)
            } else {
                b.set_read_intercept(msr, true)
            };
            assert_eq!(r, Ok(()));
            assert_eq!(b.as_bytes()[byte], 1 << bit, "MSR {msr:#x}");
            assert_eq!(b.as_bytes().iter().map(|x| x.count_ones()).sum::<u32>(), 1);
        }
    }

    #[test]
    fn msrs_outside_the_ranges_always_exit() {
        let mut v = Vmcs::default();
        v.proc.use_msr_bitmaps = true;
        v.msr_bitmap = MsrBitmap::intercept_none();
        for m in [
            0x2000u32,
            0x4000_0000,
            0xBFFF_FFFF,
            0xC000_2000,
            0xC001_0000,
            u32::MAX,
        ] {
            assert_eq!(
                v.msr_bitmap.set_read_intercept(m, false),
                Err(VmcsError::MsrOutOfRange(m))
            );
            assert_eq!(
                v.msr_bitmap.set_write_intercept(m, false),
                Err(VmcsError::MsrOutOfRange(m))
            );
            assert!(v.msr_read_exits(m) && v.msr_write_exits(m), "MSR {m:#x}");
        }
        assert!(!v.msr_read_exits(0x1FFF) && !v.msr_write_exits(0xC000_0000));
    }

    #[test]
    fn without_msr_bitmaps_every_access_exits() {
        let mut v = Vmcs {
            msr_bitmap: MsrBitmap::intercept_none(),
            ..Vmcs::default()
        };
        assert!(v.msr_write_exits(apic_msr::EOI) && v.msr_read_exits(0x10));
        v.proc.use_msr_bitmaps = true;
        assert!(!v.msr_write_exits(apic_msr::EOI) && !v.msr_read_exits(0x10));
    }

    #[test]
    fn default_has_every_control_off() {
        let v = Vmcs::default();
        assert!(!v.external_interrupt_exits() && !v.nmi_exits() && !v.exception_exits(14));
        assert_eq!(v.entry_event, None);
        assert_eq!(v.check_entry(), Ok(()));
        assert!(v.msr_bitmap.as_bytes().iter().all(|x| *x == 0xFF));
    }

    #[test]
    fn kvm_default_intercepts_the_apic() {
        let v = Vmcs::kvm_default();
        assert_eq!(v.check_entry(), Ok(()));
        assert!(v.external_interrupt_exits() && v.nmi_exits());
        assert!(v.exit.ack_interrupt_on_exit && v.proc.hlt_exiting && v.proc.use_msr_bitmaps);
        assert!(!v.pin.posted_interrupts && !v.proc2.virtual_interrupt_delivery);
        for m in apic_msr::X2APIC_RANGE {
            assert!(v.msr_read_exits(m) && v.msr_write_exits(m), "MSR {m:#x}");
        }
        assert!(
            v.msr_write_exits(apic_msr::TSC_DEADLINE) && v.msr_read_exits(apic_msr::TSC_DEADLINE)
        );
        assert!(!v.msr_write_exits(0xC000_0100), "FS_BASE passes through");
        assert!(v.exception_exits(18) && v.exception_exits(6) && !v.exception_exits(14));
        assert!(!v.posted_notification_absorbed(KVM_POSTED_INTR_VECTOR));
    }

    #[test]
    fn kvm_apicv_virtualizes_eoi_but_not_icr() {
        let v = Vmcs::kvm_apicv();
        assert_eq!(v.check_entry(), Ok(()));
        assert!(!v.msr_write_exits(apic_msr::EOI));
        assert!(!v.msr_write_exits(apic_msr::TPR));
        assert!(!v.msr_write_exits(apic_msr::SELF_IPI));
        assert!(v.msr_write_exits(apic_msr::ICR));
        assert!(v.msr_write_exits(apic_msr::TMICT));
        assert!(v.msr_write_exits(apic_msr::TSC_DEADLINE));
        assert!(!v.msr_read_exits(apic_msr::PPR));
        assert!(v.msr_read_exits(apic_msr::TMCCT));
        assert!(v.external_interrupt_exits());
        assert!(v.posted_notification_absorbed(0xF2));
        assert!(!v.posted_notification_absorbed(0xF3));
    }

    #[test]
    fn wrmsr_outcome_follows_the_bitmap_then_x2apic_virtualization() {
        use WrmsrOutcome::*;
        let v = Vmcs::kvm_apicv();
        assert_eq!(v.wrmsr_outcome(apic_msr::TPR), TprVirtualization);
        assert_eq!(v.wrmsr_outcome(apic_msr::EOI), EoiVirtualization);
        assert_eq!(v.wrmsr_outcome(apic_msr::SELF_IPI), SelfIpiVirtualization);
        assert_eq!(v.wrmsr_outcome(apic_msr::ICR), VmExit);
        assert_eq!(v.wrmsr_outcome(0xC000_0100), Msr, "FS_BASE");
        let k = Vmcs::kvm_default();
        for m in [apic_msr::TPR, apic_msr::EOI, apic_msr::SELF_IPI] {
            assert_eq!(k.wrmsr_outcome(m), VmExit, "MSR {m:#x}");
        }
        // Without virtual-interrupt delivery only the TPR is virtualized;
        // EOI and SELF IPI reach the LAPIC (SDM 29.5).
        let mut v = Vmcs::kvm_apicv();
        v.proc2.virtual_interrupt_delivery = false;
        assert_eq!(v.wrmsr_outcome(apic_msr::TPR), TprVirtualization);
        assert_eq!(v.wrmsr_outcome(apic_msr::EOI), Msr);
        assert_eq!(v.wrmsr_outcome(apic_msr::SELF_IPI), Msr);
        // Without "virtualize x2APIC mode" nothing is virtualized.
        let mut v = Vmcs::kvm_apicv();
        v.proc2.virtualize_x2apic = false;
        for m in [apic_msr::TPR, apic_msr::EOI, apic_msr::SELF_IPI] {
            assert_eq!(v.wrmsr_outcome(m), Msr, "MSR {m:#x}");
        }
    }

    /// ISE 319433-059 ch. 8: an unintercepted TSC-deadline write arms the
    /// guest deadline (no exit, no physical LAPIC write) only with the
    /// tertiary control and virtual-interrupt delivery; the expiry check
    /// fires once, at or after the deadline, and disarms it.
    #[test]
    fn apic_timer_virtualization_takes_tsc_deadline_writes_and_fires_once() {
        use WrmsrOutcome::*;
        let mut v = Vmcs::kvm_apicv();
        assert_eq!(
            v.wrmsr_outcome(apic_msr::TSC_DEADLINE),
            VmExit,
            "intercepted"
        );
        let _ = v
            .msr_bitmap
            .set_write_intercept(apic_msr::TSC_DEADLINE, false);
        assert_eq!(v.wrmsr_outcome(apic_msr::TSC_DEADLINE), Msr, "control off");
        v.proc2.apic_timer_virtualization = true;
        v.virtual_timer_vector = 0xEC;
        assert_eq!(
            v.wrmsr_outcome(apic_msr::TSC_DEADLINE),
            TscDeadlineVirtualization
        );
        assert_eq!(v.check_entry(), Ok(()));
        v.write_guest_deadline(5_000);
        assert_eq!(v.guest_deadline_shadow, 5_000);
        assert_eq!(v.guest_deadline_expired(4_999), None);
        assert_eq!(v.guest_deadline_expired(5_000), Some(0xEC));
        assert_eq!((v.guest_deadline, v.guest_deadline_shadow), (0, 0));
        assert_eq!(v.guest_deadline_expired(9_000), None, "fires once");
        v.write_guest_deadline(0);
        assert_eq!(v.guest_deadline_expired(u64::MAX), None, "0 disarms");
        // The control without virtual-interrupt delivery fails entry, and
        // the write is not virtualized.
        v.proc2.virtual_interrupt_delivery = false;
        assert_eq!(v.wrmsr_outcome(apic_msr::TSC_DEADLINE), Msr);
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::ApicTimerVirtualizationWithoutVirtualInterruptDelivery)
        );
        let mut a = super::super::apicv::VirtualApic::default();
        a.timer_fire(0xEC);
        assert_eq!(a.deliver(), Some(0xEC));
    }

    #[test]
    fn exception_bitmap_bits() {
        let mut v = Vmcs {
            exception_bitmap: 1 << 14,
            ..Vmcs::default()
        };
        assert!(v.exception_exits(14));
        assert!(!v.exception_exits(13));
        v.exception_bitmap = u32::MAX;
        assert!(v.exception_exits(31));
        assert!(!v.exception_exits(32) && !v.exception_exits(255));
    }

    #[test]
    fn entry_checks() {
        let ok = Vmcs::kvm_apicv();
        let mut v = ok.clone();
        v.pin.nmi_exiting = false;
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::VirtualNmisWithoutNmiExiting)
        );

        let mut v = Vmcs::default();
        v.proc.nmi_window_exiting = true;
        assert_eq!(v.check_entry(), Err(VmcsError::NmiWindowWithoutVirtualNmis));

        let mut v = ok.clone();
        v.proc.use_tpr_shadow = false;
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::ApicVirtualizationWithoutTprShadow)
        );

        let mut v = ok.clone();
        v.pin.ext_int_exiting = false;
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::VirtualInterruptDeliveryWithoutExtIntExiting)
        );

        let mut v = ok.clone();
        v.proc2.virtual_interrupt_delivery = false;
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::PostedInterruptsWithoutVirtualInterruptDelivery)
        );

        let mut v = ok.clone();
        v.exit.ack_interrupt_on_exit = false;
        assert_eq!(
            v.check_entry(),
            Err(VmcsError::PostedInterruptsWithoutAckOnExit)
        );

        // Virtual-interrupt delivery without posting is a legal setup.
        let mut v = ok;
        v.pin.posted_interrupts = false;
        v.exit.ack_interrupt_on_exit = false;
        assert_eq!(v.check_entry(), Ok(()));
    }

    fn covered_msr() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..=0x1FFF, 0xC000_0000u32..=0xC000_1FFF]
    }

    proptest! {
        /// One intercept change flips exactly one bit of the page, the one
        /// the architectural layout names, and no other MSR's answer.
        #[test]
        fn one_intercept_is_one_bit(msr in covered_msr(), write in any::<bool>(), other in covered_msr()) {
            let mut b = MsrBitmap::intercept_all();
            let r = if write { b.set_write_intercept(msr, false) } else { b.set_read_intercept(msr, false) };
            prop_assert_eq!(r, Ok(()));
            let half = if write { 2048 } else { 0 } + if msr >= 0xC000_0000 { 1024 } else { 0 };
            let off = (msr & 0x1FFF) as usize;
            for (i, x) in b.as_bytes().iter().enumerate() {
                let want = if i == half + off / 8 { !(1u8 << (off % 8)) } else { 0xFF };
                prop_assert_eq!(*x, want);
            }
            prop_assert_eq!(b.write_exits(msr), !write);
            prop_assert_eq!(b.read_exits(msr), write);
            if other != msr {
                prop_assert!(b.read_exits(other) && b.write_exits(other));
            }
        }

        /// Outside the two covered ranges nothing can be passed through.
        #[test]
        fn uncovered_msrs_exit(msr in any::<u32>()) {
            let covered = msr <= 0x1FFF || (0xC000_0000..=0xC000_1FFF).contains(&msr);
            let mut b = MsrBitmap::intercept_none();
            prop_assert_eq!(b.set_write_intercept(msr, false).is_ok(), covered);
            prop_assert_eq!(b.read_exits(msr), !covered);
            prop_assert_eq!(b.write_exits(msr), !covered);
        }
    }
}
