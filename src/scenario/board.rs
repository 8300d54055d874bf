//! `[machine] board`: a named machine whose parameters come from its
//! public sources (calibration/arm-kvm-host.toml `[jetson]`), for the
//! experiments that were measured on it.

use super::{bad, ArchSpec, Scenario, ScenarioError};
use serde::{Deserialize, Serialize};

/// A named board.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum BoardSpec {
    /// NVIDIA Jetson Xavier NX (did-arm.md §4): 6 Carmel ARMv8.2 cores at
    /// the 6-core modes' 1.4 GHz, the tegra194 cpuidle states (C1: WFI,
    /// exit 1 us; C6: 2 ms, for idles of 30 ms or more), JetPack 4.9's
    /// KVM halt polling (grow/shrink up to 500 us), its on-chip EQOS MAC on
    /// a wired SPI, a 1 GbE link, and a Raspberry Pi 4 as the peer host.
    #[serde(rename = "jetson-xavier-nx")]
    JetsonXavierNx,
}

impl BoardSpec {
    /// As the key spells it.
    pub fn name(self) -> &'static str {
        match self {
            BoardSpec::JetsonXavierNx => "jetson-xavier-nx",
        }
    }

    /// Its cores.
    pub fn cores(self) -> usize {
        match self {
            BoardSpec::JetsonXavierNx => 6,
        }
    }

    /// Checks the scenario against the board: its architecture and core
    /// count (given explicitly: `machine.cores = 6`).
    pub(super) fn validate(self, s: &Scenario) -> Result<(), ScenarioError> {
        if s.arch != ArchSpec::Arm64 {
            return bad(
                "machine",
                "board",
                format!(
                    "`{}` is an arm64 board: it needs arch = \"arm64\"",
                    self.name()
                ),
            );
        }
        if s.machine.cores != self.cores() {
            return bad(
                "machine",
                "board",
                format!(
                    "`{}` has {} cores: set machine.cores = {}",
                    self.name(),
                    self.cores(),
                    self.cores()
                ),
            );
        }
        Ok(())
    }
}
