//! The ixgbevf driver's interrupt-throttle update (Linux 3.6
//! `ixgbevf_set_itr` / `ixgbevf_update_itr`, docs/calibration-sources.md
//! §1). It runs in the guest's driver after every NAPI poll that completes,
//! and rewrites the VF's EITR register.
//!
//! Two versions of the same code are modelled ([`ItrDriver`]):
//! * [`ItrDriver::Ixgbevf36`], the 3.6 driver as it ran: its clean routines
//!   add the cleaned bytes and packets to the *rings'* statistics only, while
//!   `ixgbevf_update_itr` reads the *ring containers* of the q_vector, which
//!   nothing ever fills. Every update sees zero packets and leaves the class
//!   at its zero-initialised value, lowest latency, so `ixgbevf_set_itr`
//!   smooths the vector towards IXGBE_100K_ITR (≈10 µs) whatever the traffic.
//! * [`ItrDriver::Adaptive`], the algorithm as intended (and as the pre-3.5
//!   and the 4.x drivers run it): the counts reach the update, and the class
//!   follows the byte rate.

/// Which driver code rewrites EITR after a completed poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItrDriver {
    /// The driver never writes EITR: the interval stays as configured
    /// (`ethtool -C rx-usecs` of later drivers: off or a fixed interval).
    Static,
    /// Adaptive classes fed by the cleaned RX packets (RX container only;
    /// the TX container is not modelled).
    Adaptive,
    /// Linux 3.6 ixgbevf as shipped: the containers stay empty, the class
    /// stays lowest latency, the interval converges on `lowest_reg`.
    Ixgbevf36,
}

/// Latency class of a ring container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ItrClass {
    /// Target IXGBE_100K_ITR.
    Lowest,
    /// Target IXGBE_20K_ITR.
    Low,
    /// Target IXGBE_8K_ITR (3.6).
    Bulk,
}

/// Parameters of the algorithm (register values and thresholds come from
/// the calibration file).
#[derive(Clone, Copy, Debug)]
pub struct ItrParams {
    /// EITR register value for the lowest-latency class.
    pub lowest_reg: u32,
    /// EITR value for the low-latency class.
    pub low_reg: u32,
    /// EITR value for the bulk class.
    pub bulk_reg: u32,
    /// lowest → low above this many bytes per µs.
    pub low_threshold: u64,
    /// low → bulk above this many bytes per µs.
    pub bulk_threshold: u64,
    /// Which driver code runs after a completed poll.
    pub driver: ItrDriver,
}

/// Per-vector state the driver keeps (q_vector->itr plus the RX container).
#[derive(Clone, Copy, Debug)]
pub struct DynamicItr {
    /// Current EITR register value.
    pub eitr: u32,
    /// RX container class.
    pub class: ItrClass,
    /// Bytes counted since the last update.
    pub bytes: u64,
    /// Packets counted since the last update.
    pub packets: u64,
    /// Whether the clean routine's counts reach the container the update
    /// reads (false in the 3.6 driver: they go to the ring statistics).
    feeds_container: bool,
}

impl DynamicItr {
    /// Initial state: an RX vector's EITR starts at 20K
    /// (`ixgbevf_configure_msix`) [V36]. The 3.6 containers are zeroed with
    /// the q_vector (`kzalloc`), i.e. class 0, lowest latency; the adaptive
    /// model starts its class at low latency, matching the interval.
    pub fn new(p: &ItrParams) -> Self {
        let class = match p.driver {
            ItrDriver::Ixgbevf36 => ItrClass::Lowest,
            ItrDriver::Adaptive | ItrDriver::Static => ItrClass::Low,
        };
        DynamicItr {
            eitr: p.low_reg,
            class,
            bytes: 0,
            packets: 0,
            feeds_container: p.driver == ItrDriver::Adaptive,
        }
    }

    /// Counts a cleaned packet into the container the update reads (a
    /// no-op for the 3.6 driver, whose counts go to the ring statistics).
    pub fn count(&mut self, bytes: u32) {
        if self.feeds_container {
            self.bytes += bytes as u64;
            self.packets += 1;
        }
    }

    /// Runs after `napi_complete`. Returns the new EITR value when it
    /// changed (the driver then writes the register).
    pub fn update(&mut self, p: &ItrParams) -> Option<u32> {
        if p.driver == ItrDriver::Static {
            return None;
        }
        // `ixgbevf_update_itr` returns at once on an empty container.
        if self.packets != 0 {
            // The denominator is the programmed interval, not elapsed time.
            let interval_us = (self.eitr as u64 >> 2).max(1);
            let bytes_per_us = self.bytes / interval_us;
            self.class = match self.class {
                ItrClass::Lowest if bytes_per_us > p.low_threshold => ItrClass::Low,
                ItrClass::Low if bytes_per_us > p.bulk_threshold => ItrClass::Bulk,
                ItrClass::Low if bytes_per_us <= p.low_threshold => ItrClass::Lowest,
                ItrClass::Bulk if bytes_per_us <= p.bulk_threshold => ItrClass::Low,
                c => c,
            };
            self.bytes = 0;
            self.packets = 0;
        }
        let target = match self.class {
            ItrClass::Lowest => p.lowest_reg,
            ItrClass::Low => p.low_reg,
            ItrClass::Bulk => p.bulk_reg,
        };
        if target == self.eitr {
            return None;
        }
        // Exponential smoothing in rate space: new_rate = 0.9 old + 0.1 target.
        let (t, c) = (target as u64, self.eitr as u64);
        let new = (10 * t * c / (9 * t + c)) as u32;
        // Integer maths can stall one step short of a higher target (the
        // driver would rewrite the same value forever); step onto it. A
        // lower target is always reached: the quotient drops by at least 1.
        let new = if new == self.eitr { target } else { new };
        self.eitr = new;
        Some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> ItrParams {
        ItrParams {
            lowest_reg: 40,
            low_reg: 200,
            bulk_reg: 500,
            low_threshold: 10,
            bulk_threshold: 20,
            driver: ItrDriver::Adaptive,
        }
    }

    fn p36() -> ItrParams {
        ItrParams {
            driver: ItrDriver::Ixgbevf36,
            ..p()
        }
    }

    /// Feeds `polls` completed polls of `per_poll` 128-byte packets each and
    /// returns the EITR values written.
    fn run(p: &ItrParams, d: &mut DynamicItr, polls: usize, per_poll: usize) -> Vec<u32> {
        let mut writes = Vec::new();
        for _ in 0..polls {
            for _ in 0..per_poll {
                d.count(128);
            }
            writes.extend(d.update(p));
        }
        writes
    }

    #[test]
    fn linux_3_6_converges_on_the_lowest_latency_interval_whatever_the_load() {
        // 40 x 128 B per 50 µs interval = 102 B/µs: far into the bulk class
        // for the intended algorithm. The 3.6 driver never sees the counts.
        let p = p36();
        let mut d = DynamicItr::new(&p);
        assert_eq!((d.eitr, d.class), (200, ItrClass::Lowest));
        let writes = run(&p, &mut d, 100, 40);
        // The smoothing sequence of ixgbevf_set_itr from 200 towards 40.
        assert_eq!(&writes[..5], &[142, 113, 95, 83, 74]);
        assert_eq!(*writes.last().unwrap(), 40);
        assert!(writes.windows(2).all(|w| w[1] < w[0]), "{writes:?}");
        assert_eq!((d.eitr, d.class), (40, ItrClass::Lowest));
        assert_eq!(d.packets, 0, "the container the update reads stays empty");
        // Once there, nothing moves it: neither load nor silence.
        assert!(run(&p, &mut d, 50, 64).is_empty());
        assert!(run(&p, &mut d, 50, 0).is_empty());
        assert_eq!(d.eitr, 40);
    }

    #[test]
    fn the_two_drivers_part_under_the_same_traffic() {
        // Bulk traffic: intended algorithm → 8K class (500), 3.6 → 100K (40).
        let (pa, p3) = (p(), p36());
        let (mut a, mut b) = (DynamicItr::new(&pa), DynamicItr::new(&p3));
        run(&pa, &mut a, 200, 40);
        run(&p3, &mut b, 200, 40);
        assert_eq!((a.class, a.eitr), (ItrClass::Bulk, 500));
        assert_eq!((b.class, b.eitr), (ItrClass::Lowest, 40));
        // Light traffic (one 64-byte packet per poll, under 10 B/µs even at
        // the 10 µs interval): both end at lowest latency.
        let (mut a, mut b) = (DynamicItr::new(&pa), DynamicItr::new(&p3));
        for _ in 0..200 {
            a.count(64);
            a.update(&pa);
            b.count(64);
            b.update(&p3);
        }
        assert_eq!((a.class, a.eitr), (ItrClass::Lowest, 40));
        assert_eq!((b.class, b.eitr), (ItrClass::Lowest, 40));
        // Static: no writes at all.
        let ps = ItrParams {
            driver: ItrDriver::Static,
            ..p()
        };
        let mut s = DynamicItr::new(&ps);
        assert!(run(&ps, &mut s, 20, 40).is_empty());
        assert_eq!(s.eitr, 200);
    }

    #[test]
    fn classes_follow_the_byte_rate_thresholds() {
        let p = p();
        let mut d = DynamicItr::new(&p);
        // 5 x 128 B in a 50 µs interval = 12.8 B/µs: stays low
        for _ in 0..5 {
            d.count(128);
        }
        assert_eq!(d.update(&p), None);
        assert_eq!(d.class, ItrClass::Low);
        // 2 packets = 5.1 B/µs: drops to lowest and moves towards 40
        d.count(128);
        d.count(128);
        let v = d.update(&p).unwrap();
        assert_eq!(d.class, ItrClass::Lowest);
        assert!(v < 200 && v > 40, "{v}");
    }

    #[test]
    fn bulk_converges_by_smoothing() {
        let p = p();
        let mut d = DynamicItr::new(&p);
        let mut steps = 0;
        loop {
            for _ in 0..40 {
                d.count(128);
            }
            if d.update(&p).is_none() {
                break;
            }
            steps += 1;
            assert!(steps < 200);
        }
        assert_eq!(d.class, ItrClass::Bulk);
        assert_eq!(d.eitr, 500);
        assert!(steps > 5, "smoothing takes several updates, took {steps}");
        // no packets: nothing changes
        assert_eq!(d.update(&p), None);
    }
}
