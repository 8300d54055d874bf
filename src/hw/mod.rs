//! Hardware models: `x86` (LAPIC, VMCS, IOMMU, NIC), `arm` (GICv3/v4,
//! ITS, generic timer, EL2 controls) and `riscv` (H extension, IMSIC,
//! APLIC, IOMMU MSI translation), plus what none owns: the virtio
//! devices, the wire, and guest memory shared with the host.

pub mod arm;
pub mod guest_memory;
pub mod riscv;
pub mod virtio;
pub mod virtio_blk;
pub mod virtio_net;
pub mod virtio_vsock;
pub mod wire;
pub mod x86;
