//! The `hv` section's checks. Its keys ([`SchemeOptions`]) live with the
//! schemes that read them, in `crate::hv::scheme`.

use super::{require, ScenarioError};
use crate::hv::scheme::SchemeOptions;

impl SchemeOptions {
    /// Checks the `hv` keys' ranges.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if let Some(m) = self.halt_poll_max_us {
            let ok = m.is_finite() && (0.0..=100_000.0).contains(&m);
            require(ok, "hv", "halt_poll_max_us", m, "in [0, 100000]")?;
        }
        for (key, v, hi) in [
            ("es2_quota", self.es2_quota, 65_536),
            ("es2_max_poll_count", self.es2_max_poll_count, 10_000_000),
            ("es2_combining_level", self.es2_combining_level, 64),
        ] {
            if let Some(v) = v {
                require(
                    (1..=hi).contains(&v),
                    "hv",
                    key,
                    v,
                    &format!("in [1, {hi}]"),
                )?;
            }
        }
        if let Some(us) = self.es2_sleep_us {
            let ok = us.is_finite() && (0.1..=10_000.0).contains(&us);
            require(ok, "hv", "es2_sleep_us", us, "in [0.1, 10000]")?;
        }
        Ok(())
    }
}
