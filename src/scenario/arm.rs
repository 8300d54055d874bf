//! The architecture key and the ARM platform's settings.

use super::{bad, ScenarioError};
use serde::{Deserialize, Serialize};

/// The architecture guests run on.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ArchSpec {
    /// x86-64 with VT-x, x2APIC LAPICs and VT-d.
    #[default]
    #[serde(rename = "x86_64")]
    X86_64,
    /// AArch64 with EL2 and a GICv3/v4 (ITS, virtual CPU interface).
    Arm64,
    /// RV64 with the H extension, the AIA (IMSIC guest interrupt files)
    /// and a RISC-V IOMMU (docs/riscv.md).
    Riscv64,
}

/// How KVM runs at EL2 (did-arm.md §2.1).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HypModeSpec {
    /// VHE: host kernel and KVM at EL2 (HCR_EL2.E2H); 2 world switches
    /// per exit and entry.
    #[default]
    Vhe,
    /// Split mode: lowvisor at EL2, highvisor in the EL1 host kernel; 4.
    Split,
}

/// The GIC architecture version of the platform (`[arm] gic`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum GicVersionSpec {
    /// GICv3: distributor, redistributors, ITS with physical LPIs.
    #[serde(rename = "v3")]
    V3,
    /// GICv4: GICv3 plus direct injection of vLPIs (vPE residency,
    /// doorbells, VMAPP/VMAPTI/VMOVP).
    #[serde(rename = "v4")]
    V4,
    /// GICv4.1: GICv4 plus per-vPE default doorbells managed by the
    /// hardware and direct vSGIs (VSGI command, GITS_SGIR).
    #[serde(rename = "v4.1")]
    V41,
}

impl GicVersionSpec {
    /// As the key spells it.
    pub fn name(self) -> &'static str {
        match self {
            GicVersionSpec::V3 => "v3",
            GicVersionSpec::V4 => "v4",
            GicVersionSpec::V41 => "v4.1",
        }
    }
}

/// `[arm]`: the ARM platform.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ArmSpec {
    /// VHE or split-mode KVM.
    pub hyp_mode: HypModeSpec,
    /// The GIC version ("v3", "v4", "v4.1"). Unset: the least the scheme
    /// needs (v3 for kvm-arm and did-arm, v4 for kvm-arm-v4). kvm-arm-v4
    /// on a "v4.1" GIC uses GICv4.1's doorbells and direct vSGIs, as KVM
    /// does when the hardware has them (vgic_v3_probe: `has_gicv4_1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gic: Option<GicVersionSpec>,
    /// List registers per virtual CPU interface (ICH_VTR_EL2.ListRegs + 1;
    /// did-arm.md §7.6 default 4). At least 2: with one, KVM's underflow
    /// maintenance interrupt (ICH_HCR_EL2.UIE: at most one valid LR) would
    /// fire at every entry while its LR is in use.
    pub list_registers: u8,
    /// Where the host routes the physical SPI of a `net.device =
    /// "spi-nic"` NIC under KVM/ARM (its GICD_IROUTER): `vcpu-core` (the
    /// core its vCPU runs on, did-arm.md §2.6 / §4.C Fig. 6; the
    /// default) or `cpu0` (Linux's default affinity, the first online
    /// CPU, when nobody moves the IRQ). did-arm routes it to the vCPU's
    /// dedicated core itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic_spi_affinity: Option<SpiAffinitySpec>,
}

/// `[arm] nic_spi_affinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SpiAffinitySpec {
    /// GICD_IROUTER names the core the NIC's vCPU runs on.
    VcpuCore,
    /// GICD_IROUTER names core 0.
    #[serde(rename = "cpu0")]
    Cpu0,
}

impl SpiAffinitySpec {
    /// As the key spells it.
    pub fn name(self) -> &'static str {
        match self {
            SpiAffinitySpec::VcpuCore => "vcpu-core",
            SpiAffinitySpec::Cpu0 => "cpu0",
        }
    }
}

impl Default for ArmSpec {
    fn default() -> Self {
        ArmSpec {
            hyp_mode: HypModeSpec::Vhe,
            gic: None,
            list_registers: 4,
            nic_spi_affinity: None,
        }
    }
}

impl ArmSpec {
    pub(super) fn validate(&self) -> Result<(), ScenarioError> {
        if !(2..=16).contains(&self.list_registers) {
            return bad(
                "arm",
                "list_registers",
                "must be in 2..=16 (with one, UIE's underflow maintenance interrupt fires at every entry)",
            );
        }
        Ok(())
    }
}

/// `[report]`: optional report contents.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReportSpec {
    /// Count each guest event of did-arm.md §3's table (timer programmed,
    /// timer expiry, EOI, device interrupt, vCPU→vCPU IPI, host→vCPU IPI,
    /// idle) and the exits charged to it: metrics `events.*`,
    /// `exits_by_event.*`, `exits_per_event.*`. Always on with `arch =
    /// "arm64"`.
    pub exits_per_event: bool,
}
