//! x86 hardware models: cores, the x2APIC LAPIC, VMCS controls, IOMMU
//! interrupt remapping, an 82599-class SR-IOV NIC and its link. Each model is
//! a state machine that returns effects (an IPI to send, a timer to arm, an
//! MSI to deliver); the platform turns effects into events.

pub mod apicv;
pub mod avic;
pub mod core;
pub mod idt;
pub mod instr;
pub mod iommu;
pub mod iommu_ga;
pub mod lapic;
pub mod nic;
pub mod vmcb;
pub mod vmcs;

use iommu::InterruptRemappingTable;
use lapic::{ApicClocks, Lapic};
use nic::{Link, Nic};
use vmcs::Vmcs;

/// The machine under test: its cores and their LAPICs, one VMCS per vCPU,
/// the IOMMU's remapping table, the NIC and its link.
pub struct Machine {
    /// Physical cores.
    pub cores: Vec<core::Core>,
    /// One LAPIC per core, same index.
    pub lapics: Vec<Lapic>,
    /// One VMCS per vCPU.
    pub vmcs: Vec<Vmcs>,
    /// One virtual-APIC page per vCPU (used with virtual-interrupt delivery).
    pub vapic: Vec<apicv::VirtualApic>,
    /// One posted-interrupt descriptor per vCPU.
    pub pi_desc: Vec<apicv::PostedInterruptDescriptor>,
    /// One shadow IDT per vCPU, in guest memory (used when the VMCS's
    /// guest IDTR points at it).
    pub shadow_idt: Vec<idt::ShadowIdt>,
    /// virtio-net devices (their virtqueues live in guest memory), one per VM.
    pub virtio_net: Vec<crate::hw::virtio_net::VirtioNetDev>,
    /// virtio-blk devices, one per VM that has one.
    pub virtio_blk: Vec<crate::hw::virtio_blk::VirtioBlkDev>,
    /// Interrupt-remapping table.
    pub irt: InterruptRemappingTable,
    /// The SR-IOV NIC.
    pub nic: Nic,
    /// Its 10 GbE link to the client host.
    pub link: Link,
    /// One VMCB per vCPU (an AMD host's: `world::svm` reads these
    /// instead of the VMCSs).
    pub vmcb: Vec<vmcb::Vmcb>,
    /// One AVIC backing page per vCPU.
    pub avic_pages: Vec<avic::BackingPage>,
    /// Per VM: its AVIC physical and logical APIC ID tables, once the
    /// hypervisor set them up.
    pub avic_tables: Vec<avic::AvicTables>,
    /// The IOMMU's guest virtual APIC log.
    pub ga_log: iommu_ga::GaLog,
    /// Whether the processor has erratum 1235.
    pub avic_erratum: avic::Erratum1235,
}

impl Machine {
    /// A machine of `cores` cores (x2APIC id = core index), `vcpus` VMCSs.
    pub fn new(cores: usize, vcpus: usize, clocks: ApicClocks, nic: Nic, link: Link) -> Self {
        Machine {
            cores: (0..cores).map(|i| core::Core::new(i as u32)).collect(),
            lapics: (0..cores).map(|i| Lapic::new(i as u32, clocks)).collect(),
            vmcs: (0..vcpus).map(|_| Vmcs::kvm_default()).collect(),
            vapic: vec![Default::default(); vcpus],
            pi_desc: vec![Default::default(); vcpus],
            shadow_idt: vec![Default::default(); vcpus],
            virtio_net: Vec::new(),
            virtio_blk: Vec::new(),
            // An entry per VF (entry i is VM i's): at least 256, as before
            // hosts of more VMs.
            irt: InterruptRemappingTable::new(vcpus.max(256)),
            nic,
            link,
            vmcb: vec![vmcb::Vmcb::kvm_default(); vcpus],
            avic_pages: vec![Default::default(); vcpus],
            avic_tables: Vec::new(),
            // The Linux driver's GA log: 512 entries (GA_LOG_ENTRIES).
            ga_log: iommu_ga::GaLog::new(512),
            avic_erratum: Default::default(),
        }
    }

    /// The guest handler that delivering `vector` on `vcpu` runs, through
    /// the IDT its VMCS's IDTR points at (None: the gate is not present).
    pub fn idt_gate(&self, vcpu: usize, vector: u8) -> Option<u8> {
        idt::gate(self.vmcs[vcpu].guest_idtr, &self.shadow_idt[vcpu], vector)
    }

    /// The core whose LAPIC has x2APIC id `apic_id`.
    pub fn core_of_apic(&self, apic_id: u32) -> Option<usize> {
        // Ids are core indices (`new`): look there before searching.
        let i = apic_id as usize;
        if self.cores.get(i).is_some_and(|c| c.apic_id == apic_id) {
            return Some(i);
        }
        self.cores.iter().position(|c| c.apic_id == apic_id)
    }
}
