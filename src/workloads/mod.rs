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
pub mod udp_rr;
pub mod vcanal;
pub mod vcanal_http;
pub mod vmexit;
pub mod vsock;
pub mod whileloop;

/// A closed-loop client's completions per second over the measured
/// interval, from its first to its last completion (`completed` of them).
pub(crate) fn completion_rate(
    first: Option<crate::engine::Time>,
    last: crate::engine::Time,
    completed: u64,
) -> f64 {
    match first {
        Some(t0) if last > t0 && completed > 1 => {
            (completed - 1) as f64 / crate::engine::as_s(last - t0)
        }
        _ => 0.0,
    }
}
