//! The ixgbevf driver's dynamic interrupt-throttle algorithm (Linux 3.6
//! `ixgbevf_update_itr` / `ixgbevf_set_itr`, as described in
//! calibration-sources.md §1). It runs in the guest's driver after every
//! NAPI poll that completes, and rewrites the VF's EITR register.

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
    /// Dynamic mode (`rx_itr_setting == 1`, the 3.6 VF driver's only
    /// mode). Off: the interval stays what was configured (`ethtool -C
    /// rx-usecs`, which later drivers accept) and the driver never writes
    /// EITR.
    pub dynamic: bool,
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
}

impl DynamicItr {
    /// Initial state: an RX vector starts at 20K (low latency) [V36].
    pub fn new(p: &ItrParams) -> Self {
        DynamicItr {
            eitr: p.low_reg,
            class: ItrClass::Low,
            bytes: 0,
            packets: 0,
        }
    }

    /// Counts a cleaned packet.
    pub fn count(&mut self, bytes: u32) {
        self.bytes += bytes as u64;
        self.packets += 1;
    }

    /// Runs after `napi_complete`. Returns the new EITR value when it
    /// changed (the driver then writes the register).
    pub fn update(&mut self, p: &ItrParams) -> Option<u32> {
        if !p.dynamic {
            return None;
        }
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
        // Integer maths can stall one step short of the target; step onto it.
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
            dynamic: true,
        }
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
