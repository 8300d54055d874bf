//! Scenario and mechanism tests: worlds built from scenarios and run in
//! process, one module per subject. One test binary, so the library is
//! linked once (see README, Tests).

#[path = "../common/mod.rs"]
mod common;

mod amd;
mod arm;
mod arm_board;
mod arm_preemption;
mod cost_variance;
mod custom_scheme;
mod did_mechanisms;
mod directvisor;
mod eli;
mod es2;
mod es2_mechanisms;
mod explore;
mod fio;
mod host_scheduler;
mod hyperthreads;
mod invariants;
mod iperf;
mod kvm2026;
mod kvmtool;
mod limits;
mod memcached;
mod multi_vm;
mod packetgen;
mod preemption;
mod pv;
mod riscv;
mod rps;
mod rss;
mod segments;
mod sip;
mod smp;
mod vcanal;
mod vectors;
mod vsock;
mod whileloop;
