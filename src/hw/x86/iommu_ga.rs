//! The AMD IOMMU's guest virtual APIC mode (AMD I/O Virtualization
//! Technology spec rev 3.x §2.2.5 "Guest Virtual APIC", docs/amd.md): an
//! interrupt-remapping entry in 128-bit GuestMode format names a vCPU's
//! AVIC backing page (the GA root pointer), the guest vector, the host
//! physical APIC ID of the core the vCPU runs on and IsRun. The IOMMU
//! sets the vector in the backing page's IRR; if IsRun it rings the
//! doorbell of that core, otherwise (GALogIntr set) it appends the entry's
//! GATag to the guest virtual APIC log and raises the GA-log interrupt,
//! whose handler (`avic_ga_log_notifier`) wakes the vCPU. The hypervisor
//! rewrites IsRun and the destination at every vCPU load and put
//! (`amd_iommu_update_ga`).

use super::avic::BackingPage;
use std::collections::VecDeque;

/// A GuestMode interrupt-remapping entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GaIrte {
    /// GATag: the hypervisor's tag for the vCPU (KVM: VM ID << 8 | vCPU).
    pub ga_tag: u32,
    /// The guest vector.
    pub vector: u8,
    /// The host physical APIC ID a doorbell goes to.
    pub destination: u32,
    /// IsRun: the vCPU is loaded on `destination`'s core.
    pub is_run: bool,
    /// GALogIntr: log a not-running delivery and interrupt the host.
    pub ga_log_intr: bool,
    /// GA root pointer: the backing page (the vCPU's index).
    pub backing_page: usize,
}

/// What the IOMMU did with an interrupt through a GuestMode entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaDelivery {
    /// IRR set; the doorbell of the core with this host APIC ID rung.
    Doorbell(u32),
    /// IRR set; a GA-log entry written and the GA-log interrupt raised.
    Logged,
    /// IRR set; nobody told (not running and GALogIntr clear, or the log
    /// overflowed).
    Silent,
}

/// The guest virtual APIC log: a ring of GATags the IOMMU writes and the
/// host driver drains (`iommu_poll_ga_log`).
#[derive(Clone, Debug)]
pub struct GaLog {
    entries: VecDeque<u32>,
    capacity: usize,
    /// The log filled up: an entry was dropped (GALogOverflow).
    pub overflowed: bool,
    /// Entries written since the start.
    pub written: u64,
}

impl GaLog {
    /// A log of `capacity` entries (allocated up front: writing never
    /// allocates).
    pub fn new(capacity: usize) -> Self {
        GaLog {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            overflowed: false,
            written: 0,
        }
    }

    /// The host driver takes the oldest entry.
    pub fn pop(&mut self) -> Option<u32> {
        self.entries.pop_front()
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// An interrupt through GuestMode entry `irte`: the vector goes into the
/// backing page's IRR, then the doorbell, the GA log or nothing.
pub fn deliver(irte: &GaIrte, pages: &mut [BackingPage], log: &mut GaLog) -> GaDelivery {
    if let Some(p) = pages.get_mut(irte.backing_page) {
        p.irr.set(irte.vector);
    }
    if irte.is_run {
        return GaDelivery::Doorbell(irte.destination);
    }
    if !irte.ga_log_intr {
        return GaDelivery::Silent;
    }
    if log.entries.len() >= log.capacity {
        log.overflowed = true;
        return GaDelivery::Silent;
    }
    log.entries.push_back(irte.ga_tag);
    log.written += 1;
    GaDelivery::Logged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn irte(is_run: bool) -> GaIrte {
        GaIrte {
            ga_tag: (3 << 8) | 1,
            vector: 0x41,
            destination: 2,
            is_run,
            ga_log_intr: true,
            backing_page: 1,
        }
    }

    #[test]
    fn a_running_target_gets_a_doorbell_and_no_log_entry() {
        let mut pages = vec![BackingPage::default(); 2];
        let mut log = GaLog::new(4);
        assert_eq!(
            deliver(&irte(true), &mut pages, &mut log),
            GaDelivery::Doorbell(2)
        );
        assert!(pages[1].irr.test(0x41));
        assert!(log.is_empty());
    }

    #[test]
    fn a_blocked_target_gets_a_ga_log_entry_with_its_tag() {
        let mut pages = vec![BackingPage::default(); 2];
        let mut log = GaLog::new(1);
        assert_eq!(
            deliver(&irte(false), &mut pages, &mut log),
            GaDelivery::Logged
        );
        assert!(pages[1].irr.test(0x41), "IRR set before the log entry");
        assert_eq!(log.len(), 1);
        // Full: the next is dropped and the overflow flagged.
        assert_eq!(
            deliver(&irte(false), &mut pages, &mut log),
            GaDelivery::Silent
        );
        assert!(log.overflowed);
        assert_eq!(log.pop(), Some((3 << 8) | 1));
        let mut quiet = irte(false);
        quiet.ga_log_intr = false;
        assert_eq!(deliver(&quiet, &mut pages, &mut log), GaDelivery::Silent);
        assert!(log.is_empty());
    }
}
