//! The ARM machine: one GIC (distributor, a redistributor and a CPU
//! interface per core, the ITS and its tables), a generic timer per core,
//! a virtual CPU interface per vCPU (the list registers and ICH_* state
//! KVM saves and restores on schedule-out/in), and the EL2 controls each
//! core runs its guest with. The sibling of [`crate::hw::x86::Machine`]'s
//! interrupt hardware; cores and their work segments stay with the
//! platform.

use super::cpu_interface::CpuInterface;
use super::distributor::Distributor;
use super::el2::El2Controls;
use super::its::{Its, ItsTargets};
use super::params::{GicParams, ParamsError};
use super::priority::Group;
use super::redistributor::{LpiConfigTable, Redistributor, VlpiTables};
use super::timer::GenericTimer;
use super::vcpu_interface::VcpuInterface;

/// The ARM platform's interrupt hardware.
pub struct ArmMachine {
    /// What it was built from.
    pub params: GicParams,
    /// The distributor.
    pub dist: Distributor,
    /// One redistributor per core.
    pub redists: Vec<Redistributor>,
    /// One physical CPU interface per core (the host's; the guest's under
    /// HCR_EL2.IMO = 0).
    pub cpus: Vec<CpuInterface>,
    /// One generic timer per core.
    pub timers: Vec<GenericTimer>,
    /// The EL2 controls each core's guest runs with (HCR_EL2).
    pub el2: Vec<El2Controls>,
    /// One virtual CPU interface per vCPU: its list registers and ICH_HCR
    /// live here while the vCPU is out (KVM's `vgic_v3_cpu_if`), and are
    /// what the core's interface holds while it runs.
    pub vifs: Vec<VcpuInterface>,
    /// The ITS.
    pub its: Its,
    /// The physical LPI configuration table (GICR_PROPBASER).
    pub lpi_config: LpiConfigTable,
    /// The vPEs' configuration and pending tables (GICv4).
    pub vlpis: VlpiTables,
}

impl ArmMachine {
    /// A machine of `params.topology.cores` cores and `vcpus` virtual CPU
    /// interfaces, every core's EL2 controls `el2`, the host's CPU
    /// interfaces as Linux sets them (Group 1, EOImode 1: KVM needs the
    /// priority drop apart from the deactivation for HW list registers).
    pub fn new(params: GicParams, vcpus: usize, el2: El2Controls) -> Result<Self, ParamsError> {
        params.validate()?;
        let cores = params.topology.cores;
        let mut dist = Distributor::new(&params);
        dist.set_group_enabled(Group::G1, true);
        dist.set_group_enabled(Group::G0, true);
        let lpi_config = LpiConfigTable::new(params.redistributor.lpis);
        let mut redists: Vec<Redistributor> =
            (0..cores).map(|c| Redistributor::new(c, &params)).collect();
        for r in &mut redists {
            r.set_lpis_enabled(true, &lpi_config);
        }
        let mut its = Its::new(&params);
        its.set_enabled(true);
        Ok(ArmMachine {
            dist,
            redists,
            cpus: (0..cores)
                .map(|c| CpuInterface::new(c, &params).linux_host(true))
                .collect(),
            timers: (0..cores)
                .map(|_| GenericTimer::new(&params.timer))
                .collect(),
            el2: vec![el2; cores],
            vifs: (0..vcpus)
                .map(|_| VcpuInterface::new(&params).kvm_linux_guest())
                .collect(),
            its,
            lpi_config,
            vlpis: VlpiTables::for_params(&params),
            params,
        })
    }

    /// The blocks an ITS command or translation acts on.
    pub fn its_targets(&mut self) -> (&mut Its, ItsTargets<'_>) {
        (
            &mut self.its,
            ItsTargets {
                redists: &mut self.redists,
                lpi_config: &self.lpi_config,
                vlpis: &mut self.vlpis,
            },
        )
    }

    /// Whether core `core`'s physical CPU interface signals an IRQ.
    pub fn irq_line(&self, core: usize) -> bool {
        self.cpus[core].irq_line(&self.dist, &self.redists[core])
    }

    /// Whether core `core`'s physical CPU interface signals an FIQ (Group
    /// 0).
    pub fn fiq_line(&self, core: usize) -> bool {
        self.cpus[core].fiq_line(&self.dist, &self.redists[core])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::arm::intid::VTIMER_PPI;

    #[test]
    fn a_new_machine_has_per_core_blocks_and_per_vcpu_interfaces() {
        let m = ArmMachine::new(GicParams::gicv4(3, 4), 2, El2Controls::kvm_vhe()).unwrap();
        assert_eq!((m.redists.len(), m.cpus.len(), m.timers.len()), (3, 3, 3));
        assert_eq!(m.vifs.len(), 2);
        assert!(!m.irq_line(1));
        assert_eq!(m.vifs[0].list_registers(), 4);
        assert!(m.redists.iter().all(|r| r.lpis_enabled()));
    }

    #[test]
    fn a_timer_ppi_configured_on_a_core_raises_only_that_cores_irq_line() {
        let mut m = ArmMachine::new(GicParams::gicv3(2), 1, El2Controls::kvm_vhe()).unwrap();
        for r in &mut m.redists {
            r.configure(VTIMER_PPI, 0xA0, Group::G1).unwrap();
        }
        m.redists[1].set_ppi_line(VTIMER_PPI, true).unwrap();
        assert!(m.irq_line(1));
        assert!(!m.irq_line(0));
    }
}
