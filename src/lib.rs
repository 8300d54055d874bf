//! exitless: a discrete-event virtual platform on which VM interrupt-delivery
//! schemes (KVM's emulated LAPIC, DID, ...) run as real mechanism code.
//!
//! Layers, bottom up: [`engine`] (time, events, RNG, statistics), [`hw`]
//! (x86 cores, LAPIC, VMCS, IOMMU, NIC), [`hv`] (exit dispatch, host kernel,
//! one module per delivery scheme), [`guest`] (the guest kernel model),
//! [`workloads`], then [`scenario`], [`world`] (the platform that runs them),
//! [`check`] (invariants), [`report`], [`validation`] and the CLI.

pub mod calibration;
pub mod calibration_overlay;
pub mod check;
pub mod engine;
pub mod explore;
pub mod guest;
pub mod hv;
pub mod hw;
pub mod keys;
pub mod perf_kvm_stat;
pub mod report;
pub mod scenario;
pub mod sensitivity;
pub mod sweep;
pub mod validation;
pub mod workloads;
pub mod world;
