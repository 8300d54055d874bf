//! APIC virtualization state that lives in memory the VMCS points to: the
//! posted-interrupt descriptor (SDM 29.6) and the virtual-APIC page with the
//! guest-interrupt status RVI/SVI (SDM 29.1-29.2). The processor, not the
//! hypervisor, runs the rules here while the vCPU is in guest mode.

use super::lapic::{msr, ApicBitmap, ApicError};

/// Posted-interrupt descriptor: 256 posted-interrupt requests, the
/// outstanding-notification bit, suppress-notification, notification vector
/// and destination.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostedInterruptDescriptor {
    /// PIR: vectors posted and not yet moved to the virtual IRR.
    pub pir: ApicBitmap,
    /// ON: a notification is outstanding.
    pub on: bool,
    /// SN: suppress notifications (the vCPU is preempted).
    pub sn: bool,
    /// NV: notification vector.
    pub nv: u8,
    /// NDST: x2APIC id of the core to notify.
    pub ndst: u32,
}

impl PostedInterruptDescriptor {
    /// Posts `vector` (a locked bit set on PIR). Returns true when the
    /// poster must send a notification: ON was clear and SN is clear, so ON
    /// is set now (`pi_test_and_set_on`).
    pub fn post(&mut self, vector: u8) -> bool {
        self.pir.set(vector);
        if self.on || self.sn {
            return false;
        }
        self.on = true;
        true
    }

    /// Takes the posted requests and clears ON (posted-interrupt processing
    /// by the CPU, or `vmx_sync_pir_to_irr` by KVM before entry).
    pub fn take(&mut self) -> ApicBitmap {
        self.on = false;
        std::mem::take(&mut self.pir)
    }
}

/// The virtual-APIC page's interrupt state plus RVI/SVI.
#[derive(Clone, Copy, Debug, Default)]
pub struct VirtualApic {
    /// Virtual IRR.
    pub virr: ApicBitmap,
    /// Virtual ISR.
    pub visr: ApicBitmap,
    /// Virtual TPR.
    pub vtpr: u8,
    /// Requesting virtual interrupt (highest vIRR).
    pub rvi: u8,
    /// Servicing virtual interrupt (highest vISR).
    pub svi: u8,
    /// The virtual x2APIC ID register (0x802) as the hypervisor set it;
    /// None: KVM's default, the vCPU's index in its VM.
    pub x2apic_id: Option<u32>,
}

impl VirtualApic {
    /// Merges posted requests into vIRR and updates RVI.
    pub fn sync_pir(&mut self, pir: ApicBitmap) {
        self.virr.union_with(&pir);
        self.rvi = self.virr.highest().unwrap_or(0);
    }

    /// Virtual PPR (SDM 29.1.3): VTPR if its class is at least SVI's class,
    /// else SVI's class.
    pub fn vppr(&self) -> u8 {
        if self.vtpr >> 4 >= self.svi >> 4 {
            self.vtpr
        } else {
            self.svi & 0xF0
        }
    }

    /// The vector virtual-interrupt delivery would deliver now, if any.
    /// Recognition looks at RVI alone (SDM 29.2.1: RVI[7:4] > VPPR[7:4]),
    /// not at vIRR: keeping RVI equal to the highest vIRR bit is the job of
    /// whoever writes either (posted-interrupt processing, delivery,
    /// self-IPI virtualization, the VMM).
    pub fn deliverable(&self) -> Option<u8> {
        (self.rvi >> 4 > self.vppr() >> 4).then_some(self.rvi)
    }

    /// Virtual-interrupt delivery (SDM 29.2.2): vector := RVI, vISR[vector]
    /// set, SVI := vector (so VPPR := vector & F0H), vIRR[vector] cleared,
    /// RVI := highest remaining vIRR bit (0 if none).
    pub fn deliver(&mut self) -> Option<u8> {
        let v = self.deliverable()?;
        self.virr.clear(v);
        self.visr.set(v);
        self.svi = v;
        self.rvi = self.virr.highest().unwrap_or(0);
        Some(v)
    }

    /// A virtualized WRMSR of the TPR (SDM 29.5): EDX:EAX above FFH faults
    /// (#GP, nothing changes); otherwise VTPR := the value, and TPR
    /// virtualization follows (29.1.2). With virtual-interrupt delivery
    /// that is PPR virtualization, which [`vppr`](Self::vppr) computes,
    /// then an evaluation of pending virtual interrupts, which the core
    /// makes before its next instruction. Without it the processor would
    /// compare VTPR with the TPR threshold, which this model leaves out.
    pub fn write_tpr(&mut self, value: u64) -> Result<(), ApicError> {
        self.vtpr = u8::try_from(value).map_err(|_| ApicError::Reserved {
            msr: msr::TPR,
            value,
        })?;
        Ok(())
    }

    /// Self-IPI virtualization (SDM 29.1.5) of a WRMSR of SELF IPI: EDX:EAX
    /// above FFH faults (#GP, nothing changes); otherwise vIRR[vector] is
    /// set and RVI := max(RVI, vector), then pending virtual interrupts are
    /// evaluated (by the core, before its next instruction).
    pub fn self_ipi(&mut self, value: u64) -> Result<(), ApicError> {
        let vector = u8::try_from(value).map_err(|_| ApicError::Reserved {
            msr: msr::SELF_IPI,
            value,
        })?;
        self.virr.set(vector);
        self.rvi = self.rvi.max(vector);
        Ok(())
    }

    /// APIC-timer virtualization's delivery of an expired guest deadline
    /// (ISE 319433-059 §8.3): the virtual timer vector is set in vIRR and
    /// RVI := max(RVI, vector), as a self-IPI would be; the core then
    /// evaluates pending virtual interrupts, so a running guest takes it
    /// through virtual-interrupt delivery without an exit.
    pub fn timer_fire(&mut self, vector: u8) {
        self.virr.set(vector);
        self.rvi = self.rvi.max(vector);
    }

    /// EOI virtualization (SDM 29.1.4): clears the highest vISR bit (SVI),
    /// SVI := next highest. Returns the vector cleared (None: vISR empty).
    pub fn eoi(&mut self) -> Option<u8> {
        let v = self.visr.highest()?;
        self.visr.clear(v);
        self.svi = self.visr.highest().unwrap_or(0);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn post_notifies_once_until_taken_and_never_when_suppressed() {
        let mut pi = PostedInterruptDescriptor::default();
        assert!(pi.post(0x41));
        assert!(!pi.post(0xef), "ON already set: no second notification");
        let pir = pi.take();
        assert!(pir.test(0x41) && pir.test(0xef) && !pi.on && pi.pir.is_empty());
        pi.sn = true;
        assert!(!pi.post(0x41), "SN suppresses the notification");
        assert!(pi.pir.test(0x41), "but the request is kept");
    }

    #[test]
    fn delivery_follows_priority_and_eoi_virtualization_clears_svi() {
        let mut va = VirtualApic::default();
        let mut pir = ApicBitmap::default();
        pir.set(0x41);
        pir.set(0xef);
        va.sync_pir(pir);
        assert_eq!(va.rvi, 0xef);
        assert_eq!(va.deliver(), Some(0xef));
        assert_eq!(va.svi, 0xef);
        // 0x41's class is below the in-service 0xef: not deliverable.
        assert_eq!(va.deliverable(), None);
        assert_eq!(va.eoi(), Some(0xef));
        assert_eq!(va.deliver(), Some(0x41));
        assert_eq!(va.eoi(), Some(0x41));
        assert_eq!(va.eoi(), None, "vISR empty");
        // VTPR masks a class.
        va.vtpr = 0x50;
        let mut p = ApicBitmap::default();
        p.set(0x45);
        va.sync_pir(p);
        assert_eq!(va.deliverable(), None);
        va.vtpr = 0x30;
        assert_eq!(va.deliverable(), Some(0x45));
    }

    /// SDM 29.2.1/29.2.2: RVI alone is recognized and delivered, whether or
    /// not its vIRR bit is set; RVI then drops to the highest vIRR bit.
    #[test]
    fn delivery_follows_rvi_not_virr() {
        let mut va = VirtualApic::default();
        va.virr.set(0x31);
        // A VMM wrote guest-interrupt status with RVI above every vIRR bit.
        va.rvi = 0x61;
        assert_eq!(va.deliverable(), Some(0x61));
        assert_eq!(va.deliver(), Some(0x61));
        assert!(va.visr.test(0x61) && !va.virr.test(0x61));
        assert_eq!((va.svi, va.vppr(), va.rvi), (0x61, 0x60, 0x31));
        assert_eq!(va.deliver(), None, "class 3 is below VPPR's class 6");
        assert_eq!(va.eoi(), Some(0x61));
        assert_eq!(va.deliver(), Some(0x31));
        assert_eq!(va.rvi, 0, "vIRR empty: RVI 0");
        assert_eq!(va.deliver(), None, "RVI 0 is never recognized");
    }

    /// SDM 29.5 / 29.1.5: SELF IPI sets vIRR and raises RVI to the vector
    /// if higher; TPR sets VTPR; values above FFH fault and change nothing.
    #[test]
    fn self_ipi_and_tpr_virtualization() {
        let mut va = VirtualApic::default();
        assert_eq!(va.self_ipi(0x45), Ok(()));
        assert_eq!(va.self_ipi(0x81), Ok(()));
        assert_eq!(va.self_ipi(0x60), Ok(()));
        assert_eq!(va.rvi, 0x81);
        assert!(va.virr.test(0x45) && va.virr.test(0x60) && va.virr.test(0x81));
        assert_eq!(
            va.self_ipi(0x181),
            Err(ApicError::Reserved {
                msr: msr::SELF_IPI,
                value: 0x181
            })
        );
        assert_eq!(va.write_tpr(0x90), Ok(()));
        assert_eq!(va.deliverable(), None, "VTPR class 9 masks 0x81");
        assert_eq!(
            va.write_tpr(0x100),
            Err(ApicError::Reserved {
                msr: msr::TPR,
                value: 0x100
            })
        );
        assert_eq!(va.vtpr, 0x90);
        assert_eq!(va.write_tpr(0), Ok(()));
        assert_eq!(va.deliver(), Some(0x81));
        assert_eq!(va.rvi, 0x60);
    }

    proptest! {
        /// Through any mix of posting, delivery, EOI virtualization and VTPR
        /// writes, RVI stays the highest vIRR bit, so recognizing RVI alone
        /// never delivers a vector nobody requested.
        #[test]
        fn rvi_tracks_virr_and_delivery_is_never_spurious(
            ops in proptest::collection::vec((0u8..5, 16u8..=255), 0..200)
        ) {
            let mut va = VirtualApic::default();
            for (op, v) in ops {
                match op {
                    0 => {
                        let mut pir = ApicBitmap::default();
                        pir.set(v);
                        va.sync_pir(pir);
                    }
                    1 => {
                        let requested = va.virr;
                        if let Some(d) = va.deliver() {
                            prop_assert!(requested.test(d), "delivered {d:#x} not in vIRR");
                            prop_assert!(va.visr.test(d));
                        }
                    }
                    2 => {
                        va.eoi();
                    }
                    3 => prop_assert_eq!(va.self_ipi(u64::from(v)), Ok(())),
                    _ => prop_assert_eq!(va.write_tpr(u64::from(v)), Ok(())),
                }
                prop_assert_eq!(va.rvi, va.virr.highest().unwrap_or(0));
                prop_assert_eq!(va.svi, va.visr.highest().unwrap_or(0));
            }
        }
    }
}
