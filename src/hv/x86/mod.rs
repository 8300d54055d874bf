//! The delivery schemes that drive x86 hardware (VMCS controls, the
//! LAPIC, VT-d interrupt remapping and posted interrupts): KVM's emulated
//! LAPIC, APICv, kvm-2026, ELI/ELVIS, DID, the naive design DID warns
//! about, and bare metal. What is arch-neutral (the scheme interface, the
//! host scheduler, vhost and the block back end, ES2's hybrid handling and
//! redirection, exit accounting) is in `crate::hv`; an ARM sibling
//! (`hv::arm`) would hold KVM/ARM's vgic and DID on ARM.

pub mod apicv;
pub mod bare_metal;
pub mod did;
pub mod directvisor;
pub mod eli;
pub mod elvis;
pub mod kvm;
pub mod kvm2026;
pub mod naive;
pub mod svm;
pub mod vlapic;
