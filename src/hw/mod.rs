//! Hardware models. Only `x86` exists so far; ARM (GIC, ITS) will sit beside it.

pub mod x86;
