//! Workloads: programs inside guests (as [`crate::guest::app::App`]s) and
//! the external client host's traffic generator.

pub mod burn;
pub mod cyclictest;
pub mod fio;
pub mod http;
pub mod iperf;
pub mod memcached;
pub mod netperf;
pub mod netpipe;
pub mod peer;
pub mod ping;
pub mod sip;
pub mod udp;
pub mod whileloop;
