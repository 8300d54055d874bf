//! Parameters of the ARM interrupt hardware: sizes, counts and feature flags,
//! kept apart from the behaviour of the blocks they size (gem5's `Gic.py`
//! plays the same role for its GICv3, kvm-arm-and-peers.md §3).
//!
//! Every table a block owns is allocated once, at construction, from these
//! numbers; nothing on the per-interrupt path allocates. [`GicParams::validate`]
//! rejects combinations the architecture does not allow, so the blocks can
//! assume consistent sizes.

use crate::hw::arm::intid::{LPI_BASE, MAX_CORES, SPI_BASE, SPI_LIMIT};

/// The affinity path of a PE, as MPIDR_EL1 and GICD_IROUTER spell it
/// (Aff3.Aff2.Aff1.Aff0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Affinity {
    /// Affinity level 3.
    pub aff3: u8,
    /// Affinity level 2.
    pub aff2: u8,
    /// Affinity level 1 (the cluster, in the usual numbering).
    pub aff1: u8,
    /// Affinity level 0 (the PE within its cluster).
    pub aff0: u8,
}

impl Affinity {
    /// The upper three levels as one key (the "cluster" an SGI target list
    /// names).
    pub fn cluster(&self) -> u32 {
        (u32::from(self.aff3) << 16) | (u32::from(self.aff2) << 8) | u32::from(self.aff1)
    }
}

/// How cores map onto affinity values: core `i` is `Aff1 = i / per_cluster`,
/// `Aff0 = i % per_cluster`, `Aff2 = Aff3 = 0`. A cluster of at most 16 PEs
/// keeps every core reachable by an ICC_SGI1R_EL1 target list without the
/// range selector (GICv3 §12.2.23, RS = 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Number of physical cores (PEs), each with a redistributor and a CPU
    /// interface.
    pub cores: usize,
    /// PEs per Aff1 cluster, 1..=16.
    pub per_cluster: usize,
}

impl Topology {
    /// The affinity of core `core`.
    pub fn affinity(&self, core: usize) -> Affinity {
        let per = self.per_cluster.max(1);
        Affinity {
            aff3: 0,
            aff2: 0,
            aff1: (core / per) as u8,
            aff0: (core % per) as u8,
        }
    }

    /// The core with affinity `aff`, if there is one.
    pub fn core_of(&self, aff: Affinity) -> Option<usize> {
        let per = self.per_cluster.max(1);
        if aff.aff3 != 0 || aff.aff2 != 0 || usize::from(aff.aff0) >= per {
            return None;
        }
        let core = usize::from(aff.aff1) * per + usize::from(aff.aff0);
        (core < self.cores).then_some(core)
    }
}

/// Distributor (GICD) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributorParams {
    /// Number of SPIs implemented (INTIDs 32..32+spis), at most 988; GICD_TYPER
    /// reports it rounded up to a multiple of 32 (gem5's `it_lines`).
    pub spis: u32,
}

/// Redistributor (GICR) parameters, the same for every core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedistributorParams {
    /// Number of physical LPIs (INTIDs 8192..8192+lpis); sizes the LPI
    /// configuration and pending tables (GICR_PROPBASER.IDbits).
    pub lpis: u32,
    /// Number of virtual LPIs per vPE (vINTIDs 8192..8192+vlpis); sizes each
    /// vPE's virtual pending table. Ignored without GICv4.
    pub vlpis: u32,
    /// Number of vPEs the platform can map (GICv4 vPE table size).
    pub vpes: u16,
}

/// Physical CPU interface (ICC_*) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInterfaceParams {
    /// Implemented priority bits, 4..=8 (ICC_CTLR_EL1.PRIbits + 1). The
    /// preemption bits are the same, at most 7.
    pub priority_bits: u8,
}

/// Virtual CPU interface (ICH_*/ICV_*) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuInterfaceParams {
    /// List registers per core (ICH_VTR_EL2.ListRegs + 1), 1..=16; 4 on
    /// common cores (Cortex-A57/A72/Neoverse), 16 in gem5.
    pub list_registers: u8,
    /// Virtual priority bits, 5..=8 (ICH_VTR_EL2.PRIbits + 1).
    pub priority_bits: u8,
}

/// Interrupt Translation Service parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItsParams {
    /// DeviceIDs 0..devices (the device table's size).
    pub devices: u32,
    /// EventID bits the largest ITT may have (an ITT holds up to
    /// 2^event_bits entries), 1..=16.
    pub event_bits: u8,
    /// Collections 0..collections (ICIDs).
    pub collections: u16,
    /// Command-queue capacity in commands (GITS_CBASER.Size × 4 KiB / 32 B).
    pub queue: usize,
}

/// Generic timer parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerParams {
    /// CNTFRQ_EL0: the system counter's frequency in Hz.
    pub frequency_hz: u64,
}

/// The whole GIC and its timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GicParams {
    /// Cores and their affinities.
    pub topology: Topology,
    /// GICv4 direct injection of virtual LPIs (vPE residency, doorbells,
    /// VMAPP/VMAPTI/VMOVI/VMOVP).
    pub gicv4: bool,
    /// GICv4.1: per-vPE default doorbells and vSGIs (the VSGI command).
    /// Needs `gicv4`.
    pub gicv4_1: bool,
    /// The distributor.
    pub distributor: DistributorParams,
    /// Each redistributor.
    pub redistributor: RedistributorParams,
    /// Each physical CPU interface.
    pub cpu_interface: CpuInterfaceParams,
    /// Each virtual CPU interface.
    pub vcpu_interface: VcpuInterfaceParams,
    /// The ITS.
    pub its: ItsParams,
    /// Each core's generic timer.
    pub timer: TimerParams,
}

/// A parameter combination the architecture (or the model) does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// Zero cores, more than the model's limit, or a cluster of 0 or > 16.
    #[error("bad topology: {cores} cores, {per_cluster} per cluster")]
    Topology {
        /// Cores asked for.
        cores: usize,
        /// PEs per cluster asked for.
        per_cluster: usize,
    },
    /// More SPIs than INTIDs 32..1019 hold.
    #[error("{0} SPIs exceed INTIDs 32..1019")]
    Spis(u32),
    /// Priority bits outside what the interface allows.
    #[error("{0} priority bits is outside the allowed range")]
    PriorityBits(u8),
    /// List registers outside 1..=16.
    #[error("{0} list registers is outside 1..=16")]
    ListRegisters(u8),
    /// LPI count that overflows a 24-bit INTID space.
    #[error("{0} LPIs overflow the INTID space")]
    Lpis(u32),
    /// EventID bits outside 1..=16.
    #[error("{0} EventID bits is outside 1..=16")]
    EventBits(u8),
    /// GICv4.1 without GICv4.
    #[error("GICv4.1 needs GICv4")]
    V41WithoutV4,
    /// A zero timer frequency.
    #[error("the counter frequency must not be zero")]
    Frequency,
}

impl GicParams {
    /// A GICv3 with `cores` cores in clusters of 4: 256 SPIs, 8192 LPIs, 5
    /// priority bits, 4 list registers, a 64-device ITS and a 100 MHz
    /// counter (the Neoverse/Altra-class values; the DID-on-ARM proposal's
    /// default is GICv3 with GICv4 optional, did-arm.md §7.1).
    pub fn gicv3(cores: usize) -> Self {
        GicParams {
            topology: Topology {
                cores,
                per_cluster: 4,
            },
            gicv4: false,
            gicv4_1: false,
            distributor: DistributorParams { spis: 256 },
            redistributor: RedistributorParams {
                lpis: 8192,
                vlpis: 0,
                vpes: 0,
            },
            cpu_interface: CpuInterfaceParams { priority_bits: 5 },
            vcpu_interface: VcpuInterfaceParams {
                list_registers: 4,
                priority_bits: 5,
            },
            its: ItsParams {
                devices: 64,
                event_bits: 8,
                collections: 64,
                queue: 128,
            },
            timer: TimerParams {
                frequency_hz: 100_000_000,
            },
        }
    }

    /// [`gicv3`](Self::gicv3) plus GICv4 direct vLPI injection for up to
    /// `vpes` vPEs with 8192 vLPIs each.
    pub fn gicv4(cores: usize, vpes: u16) -> Self {
        let mut p = Self::gicv3(cores);
        p.gicv4 = true;
        p.redistributor.vlpis = 8192;
        p.redistributor.vpes = vpes;
        p
    }

    /// [`gicv4`](Self::gicv4) with the GICv4.1 features.
    pub fn gicv4_1(cores: usize, vpes: u16) -> Self {
        let mut p = Self::gicv4(cores, vpes);
        p.gicv4_1 = true;
        p
    }

    /// The first INTID past the implemented SPIs.
    pub fn spi_end(&self) -> u32 {
        SPI_BASE + self.distributor.spis
    }

    /// The first INTID past the implemented LPIs.
    pub fn lpi_end(&self) -> u32 {
        LPI_BASE + self.redistributor.lpis
    }

    /// Checks the combination; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ParamsError> {
        let t = self.topology;
        if t.cores == 0 || t.cores > MAX_CORES || t.per_cluster == 0 || t.per_cluster > 16 {
            return Err(ParamsError::Topology {
                cores: t.cores,
                per_cluster: t.per_cluster,
            });
        }
        if self.distributor.spis > SPI_LIMIT - SPI_BASE {
            return Err(ParamsError::Spis(self.distributor.spis));
        }
        let pb = self.cpu_interface.priority_bits;
        if !(4..=8).contains(&pb) {
            return Err(ParamsError::PriorityBits(pb));
        }
        let vb = self.vcpu_interface.priority_bits;
        if !(5..=8).contains(&vb) {
            return Err(ParamsError::PriorityBits(vb));
        }
        let lr = self.vcpu_interface.list_registers;
        if !(1..=16).contains(&lr) {
            return Err(ParamsError::ListRegisters(lr));
        }
        for n in [self.redistributor.lpis, self.redistributor.vlpis] {
            if n > (1 << 24) - LPI_BASE {
                return Err(ParamsError::Lpis(n));
            }
        }
        if !(1..=16).contains(&self.its.event_bits) {
            return Err(ParamsError::EventBits(self.its.event_bits));
        }
        if self.gicv4_1 && !self.gicv4 {
            return Err(ParamsError::V41WithoutV4);
        }
        if self.timer.frequency_hz == 0 {
            return Err(ParamsError::Frequency);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(GicParams::gicv3(4).validate(), Ok(()));
        assert_eq!(GicParams::gicv4(8, 16).validate(), Ok(()));
        assert_eq!(GicParams::gicv4_1(2, 4).validate(), Ok(()));
    }

    #[test]
    fn bad_combinations_are_refused() {
        let mut p = GicParams::gicv3(4);
        p.gicv4_1 = true;
        assert_eq!(p.validate(), Err(ParamsError::V41WithoutV4));
        let mut p = GicParams::gicv3(0);
        p.topology.per_cluster = 4;
        assert!(matches!(p.validate(), Err(ParamsError::Topology { .. })));
        let mut p = GicParams::gicv3(4);
        p.distributor.spis = 989;
        assert_eq!(p.validate(), Err(ParamsError::Spis(989)));
        let mut p = GicParams::gicv3(4);
        p.vcpu_interface.list_registers = 17;
        assert_eq!(p.validate(), Err(ParamsError::ListRegisters(17)));
        let mut p = GicParams::gicv3(4);
        p.cpu_interface.priority_bits = 3;
        assert_eq!(p.validate(), Err(ParamsError::PriorityBits(3)));
    }

    #[test]
    fn affinity_round_trips_and_rejects_strangers() {
        let t = Topology {
            cores: 10,
            per_cluster: 4,
        };
        for c in 0..10 {
            assert_eq!(t.core_of(t.affinity(c)), Some(c));
        }
        assert_eq!(t.affinity(6).aff1, 1);
        assert_eq!(t.affinity(6).aff0, 2);
        // Aff0 past the cluster size, a core past the count, Aff2 != 0.
        let a = |aff1, aff0| Affinity {
            aff1,
            aff0,
            ..Affinity::default()
        };
        assert_eq!(t.core_of(a(0, 4)), None);
        assert_eq!(t.core_of(a(2, 2)), None);
        assert_eq!(
            t.core_of(Affinity {
                aff2: 1,
                ..Affinity::default()
            }),
            None
        );
    }

    /// The blocks do not rely on `validate` having been called: built from
    /// out-of-range parameters they clamp or come out empty, and still
    /// answer without panicking.
    #[test]
    fn blocks_tolerate_unvalidated_params() {
        use crate::hw::arm::{
            cpu_interface::CpuInterface, distributor::Distributor, its::Its,
            redistributor::Redistributor, timer::GenericTimer, vcpu_interface::VcpuInterface,
        };
        let mut p = GicParams::gicv3(1);
        p.cpu_interface.priority_bits = 0;
        p.vcpu_interface.priority_bits = 0;
        p.vcpu_interface.list_registers = 0;
        p.distributor.spis = 5000;
        p.its.queue = 0;
        p.its.event_bits = 40;
        p.its.devices = 1;
        p.timer.frequency_hz = 0;
        p.topology.per_cluster = 0;
        let mut d = Distributor::new(&p);
        assert!(d.set_spi_line(1019, true).is_ok());
        assert!(d.set_spi_line(1020, true).is_err());
        let mut r = Redistributor::new(0, &p);
        let c = CpuInterface::new(0, &p);
        assert_eq!((c.read_ctlr() >> 8) & 7, 3, "clamped to 4 priority bits");
        let v = VcpuInterface::new(&p);
        assert_eq!(v.list_registers(), 1);
        let _ = v.vtr();
        let its = Its::new(&p);
        assert_eq!(its.queued(), 0);
        let t = GenericTimer::new(&p.timer);
        assert_eq!(t.cntpct(crate::engine::SEC), 1);
        let mut c = c;
        assert_eq!(c.read_iar1(&mut d, &mut r), crate::hw::arm::intid::SPURIOUS);
    }
}
