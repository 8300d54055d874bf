//! Hardware models. Only `x86` exists so far; ARM (GIC, ITS) will sit beside it.

pub mod guest_memory;
pub mod virtio;
pub mod virtio_blk;
pub mod virtio_net;
pub mod wire;
pub mod x86;
