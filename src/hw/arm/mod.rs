//! ARM interrupt hardware (placeholder, filled in below).

pub mod bank;
pub mod cpu_interface;
pub mod distributor;
pub mod el2;
pub mod intid;
pub mod its;
pub mod params;
pub mod priority;
pub mod redistributor;
pub mod timer;
pub mod vcpu_interface;
