//! Stage 1, topology: the machine's cores, the VMs and their vCPUs (each a
//! host thread), where each vCPU starts and where it may run. Nothing here
//! is hardware yet; every later stage reads this plan.

use super::BuildError;
use crate::engine::CpuMask;
use crate::hv::scheme::Scheme;
use crate::scenario::{Scenario, VmView};

/// One vCPU thread: its VM, its index in the VM, the core it starts on.
#[derive(Clone, Copy, Debug)]
pub(in crate::world) struct VcpuPlace {
    pub vm: usize,
    pub index: usize,
    pub core: usize,
}

/// The machine's layout as a scenario describes it.
pub(in crate::world) struct Topology<'s> {
    /// The VMs, in order.
    pub views: Vec<VmView<'s>>,
    /// Physical cores.
    pub cores: usize,
    /// Whether the VMs run under a hypervisor (false: bare metal).
    pub virtualized: bool,
    /// Every vCPU, VM by VM (the global vCPU index is the position).
    pub vcpus: Vec<VcpuPlace>,
    /// Per vCPU: the cores it may run on (bit i = core i).
    pub allowed: Vec<CpuMask>,
    /// Every core some vCPU may run on.
    pub vcpu_cores_mask: CpuMask,
    /// Per VM: its vCPUs' global indices.
    pub vm_vcpus: Vec<Vec<usize>>,
    /// Per core: the vCPU that starts there (the first placed on it); the
    /// others wait in the host scheduler's run queue.
    pub first_on_core: Vec<Option<usize>>,
}

impl<'s> Topology<'s> {
    /// Each vCPU as a host thread for the scheduler: its VM, its first
    /// core and the cores it may run on.
    pub fn vcpu_threads(&self) -> Vec<crate::world::sched::VcpuThread> {
        self.vcpus
            .iter()
            .zip(&self.allowed)
            .map(|(p, &allowed)| crate::world::sched::VcpuThread {
                vm: p.vm,
                core: p.core,
                allowed,
            })
            .collect()
    }

    /// Lays out the scenario's VMs on its machine for `scheme`.
    pub fn plan(s: &'s Scenario, scheme: &dyn Scheme) -> Result<Self, BuildError> {
        let virtualized = scheme.virtualized();
        let cores = s.machine.cores;
        let views = s.vm_views();
        let refuse = |what: &str| {
            Err(BuildError::Scenario(format!(
                "scheme {}: {what}",
                scheme.name()
            )))
        };
        if !virtualized && views.len() > 1 {
            return refuse("several VMs need a hypervisor");
        }
        let vcpus: Vec<VcpuPlace> = views
            .iter()
            .enumerate()
            .flat_map(|(vm, v)| {
                v.cores
                    .iter()
                    .enumerate()
                    .map(move |(index, &core)| VcpuPlace { vm, index, core })
            })
            .collect();
        let allowed: Vec<CpuMask> = views
            .iter()
            .flat_map(|v| v.allowed.iter().copied())
            .collect();
        let vcpu_cores_mask = allowed.iter().fold(CpuMask::EMPTY, |m, &a| m.union(a));
        if !virtualized && allowed.iter().any(|a| a.count() > 1) {
            return refuse(
                "allowed_cores needs a hypervisor (bare metal runs its kernel on its core)",
            );
        }
        // A native SMP kernel runs one CPU per core of `cores`; its IPIs
        // go to those cores' own APIC IDs (`World::vmx_op` on bare metal).
        if !virtualized
            && (1..vcpus.len()).any(|i| vcpus[..i].iter().any(|v| v.core == vcpus[i].core))
        {
            return refuse("a native SMP kernel needs a core of its own for each CPU");
        }
        let vm_vcpus = (0..views.len())
            .map(|vm| (0..vcpus.len()).filter(|&k| vcpus[k].vm == vm).collect())
            .collect();
        let mut first_on_core = vec![None; cores];
        for (k, v) in vcpus.iter().enumerate() {
            first_on_core[v.core].get_or_insert(k);
        }
        Ok(Topology {
            views,
            cores,
            virtualized,
            vcpus,
            allowed,
            vcpu_cores_mask,
            vm_vcpus,
            first_on_core,
        })
    }

    /// VMs.
    pub fn vms(&self) -> usize {
        self.views.len()
    }
}
