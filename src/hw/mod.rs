//! Hardware models: `x86` (LAPIC, VMCS, IOMMU, NIC) and `arm` (GICv3/v4, ITS, generic timer, EL2 controls), plus the shared virtio devices and wire.

pub mod arm;
pub mod virtio;
pub mod virtio_blk;
pub mod virtio_net;
pub mod wire;
pub mod x86;
