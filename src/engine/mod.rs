//! The discrete-event engine: simulated time, the event queue with its
//! deterministic tie-break, seeded RNG streams, and statistics.

pub mod cpumask;
pub mod queue;
pub mod rng;
pub mod stats;
pub mod time;

pub use cpumask::{BitMask, CpuMask, VcpuMask, CPUMASK_BITS, VCPUMASK_BITS};
pub use queue::EventQueue;
pub use rng::RngStream;
pub use stats::{LatencyHistogram, Summary};
pub use time::*;
