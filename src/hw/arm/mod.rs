//! ARM hardware models: a GICv3/v4 interrupt controller (distributor,
//! redistributors, CPU interfaces, virtual CPU interfaces, ITS), the
//! per-core generic timer, and the EL2 controls that decide what exits.
//! The sibling of [`crate::hw::x86`]; the specification is the DID-on-ARM
//! proposal (docs: did-arm.md §2) and the KVM/ARM notes
//! (kvm-arm-and-peers.md §2–3).
//!
//! Each block is a state machine over its architectural registers and
//! tables, sized once from [`params`]; software reaches it through typed
//! register methods (and MMIO offsets where the architecture has them), and
//! bad input is an error, never a panic. Blocks do not own each other: a
//! call that spans blocks takes the ones it needs as arguments (an
//! acknowledge takes the distributor and the core's redistributor), so the
//! platform that will own them (the world) stays free to lay them out.
//!
//! # How an interrupt flows
//!
//! A wired device interrupt today (did-arm.md §2.6, one exit):
//!
//! ```text
//! NIC line ──► Distributor::set_spi_line(spi)         SPI pending; IROUTER picks the core
//!          ──► CpuInterface::irq_line(&dist, &redist) IRQ asserted at that core
//!          ──► El2Controls::physical_irq_exits()      guest running, IMO = 1: exit to EL2
//!          ──► CpuInterface::read_iar1 / write_eoir1  host acks; EOImode 1: priority drop only,
//!                                                     the SPI stays active
//!          ──► VcpuInterface::inject(ListRegister::hardware(vintid, spi, prio))
//!          ──► (entry) VcpuInterface::virq_line       the vCPU sees a virtual IRQ
//!          ──► VcpuInterface::read_iar1               guest ICV_IAR1 (no trap: the accessor decides)
//!          ──► VcpuInterface::guest_eoir              guest ICV_EOIR1: the LR deactivates, HW = 1
//!                                                     deactivates the physical SPI too (no exit)
//! ```
//!
//! The virtual timer takes the same path from its PPI
//! ([`timer::GenericTimer`] → [`redistributor::Redistributor::set_ppi_line`]).
//!
//! A message-signalled interrupt through the ITS (did-arm.md §2.6, proposed):
//!
//! ```text
//! MSI (DeviceID, EventID) ──► Its::translate         device table → ITT → ITE
//!   physical ITE ──► collection → Redistributor::set_lpi_pending → that core's IRQ
//!   virtual ITE  ──► vPE table → Redistributor::post_vlpi
//!        resident vPE     ──► its pending table; the vCPU interface offers it
//!                             (Redistributor::direct_vlpis) — no hypervisor
//!        non-resident vPE ──► pending table keeps it; the doorbell LPI is made
//!                             pending for the host, which schedules the vCPU;
//!                             Redistributor::make_resident then delivers it
//! ```

#![deny(missing_docs)]

pub mod bank;
pub mod cpu_interface;
pub mod distributor;
pub mod el2;
pub mod intid;
pub mod its;
pub mod machine;
pub mod params;
pub mod priority;
pub mod redistributor;
pub mod timer;
pub mod vcpu_interface;

#[cfg(test)]
mod tests {
    //! The two flows of the module documentation, end to end.

    use super::cpu_interface::CpuInterface;
    use super::distributor::{Distributor, Route};
    use super::el2::{El2Controls, SysregOutcome};
    use super::intid::{SPURIOUS, VTIMER_PPI};
    use super::its::{Its, ItsCommand, ItsTargets, MsiOutcome};
    use super::params::GicParams;
    use super::priority::Group;
    use super::redistributor::{LpiConfigTable, Redistributor, VlpiTables};
    use super::timer::{CntReg, GenericTimer, TimerChannel, CTL_ENABLE};
    use super::vcpu_interface::{ListRegister, VcpuInterface};
    use crate::hw::arm::cpu_interface::IccReg;

    #[test]
    fn nic_spi_to_guest_eoi_with_one_exit() {
        let p = GicParams::gicv3(2);
        let mut dist = Distributor::new(&p);
        dist.set_group_enabled(Group::G1, true);
        let mut redist: Vec<_> = (0..2).map(|c| Redistributor::new(c, &p)).collect();
        let mut cpu = CpuInterface::new(1, &p).linux_host(true);
        let el2 = El2Controls::kvm_vhe();
        let mut vif = VcpuInterface::new(&p).kvm_linux_guest();
        let spi = 64;
        dist.configure(
            spi,
            0xA0,
            Group::G1,
            false,
            Route::Affinity(p.topology.affinity(1)),
        )
        .unwrap();

        // The NIC raises its line; core 1 runs the guest.
        assert_eq!(dist.set_spi_line(spi, true), Ok(Some(1)));
        assert!(cpu.irq_line(&dist, &redist[1]));
        assert!(el2.physical_irq_exits(), "the one exit: to EL2");
        // KVM acks (priority drop only) and writes a HW list register.
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist[1]), spi);
        cpu.write_eoir1(spi, &mut dist, &mut redist[1]).unwrap();
        assert!(
            !cpu.irq_line(&dist, &redist[1]),
            "active SPI no longer signals"
        );
        vif.inject(ListRegister::hardware(spi, spi, 0xA0)).unwrap();
        // Back in the guest: ICV accesses, no trap.
        let ich = vif.hcr();
        assert_eq!(
            el2.sysreg_outcome(IccReg::Iar1, false, &ich),
            SysregOutcome::Virtual
        );
        assert_eq!(
            el2.sysreg_outcome(IccReg::Eoir1, true, &ich),
            SysregOutcome::Virtual
        );
        assert!(vif.virq_line(None));
        assert_eq!(vif.read_iar1(None), spi);
        // The driver services the NIC, which drops its line; then EOI.
        dist.set_spi_line(spi, false).unwrap();
        let e = vif
            .guest_eoir(spi, None, &mut dist, &mut redist[1])
            .unwrap();
        assert_eq!(e.hw_deactivate, Some(spi));
        assert!(!dist.bank().is_active(spi));
        // A second interrupt is signalled again: nothing was left active,
        // and the guest's ack and EOI above needed no exit.
        assert_eq!(dist.set_spi_line(spi, true), Ok(Some(1)));
        assert!(cpu.irq_line(&dist, &redist[1]));
        assert_eq!(el2.world_switches_per_exit(), 2);
    }

    #[test]
    fn virtual_timer_expiry_to_guest() {
        let p = GicParams::gicv3(1);
        let mut dist = Distributor::new(&p);
        let mut redist = Redistributor::new(0, &p);
        redist.configure(VTIMER_PPI, 0xA0, Group::G1).unwrap();
        let mut cpu = CpuInterface::new(0, &p).linux_host(true);
        let mut vif = VcpuInterface::new(&p).kvm_linux_guest();
        let mut timer = GenericTimer::new(&p.timer);
        // The guest programs its virtual timer: no exit (a sysreg write the
        // EL2 controls do not trap).
        timer.write(CntReg::VTval, 1000, 0).unwrap();
        let u = timer.write(CntReg::VCtl, CTL_ENABLE, 0).unwrap();
        let (at, gen) = u.arm.unwrap();
        let level = timer.expired(TimerChannel::Virtual, at, gen).unwrap();
        assert!(redist.set_ppi_line(VTIMER_PPI, level).unwrap());
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), VTIMER_PPI);
        cpu.write_eoir1(VTIMER_PPI, &mut dist, &mut redist).unwrap();
        vif.inject(ListRegister::hardware(27, VTIMER_PPI, 0xA0))
            .unwrap();
        assert_eq!(vif.read_iar1(None), 27);
        // The guest's handler reprograms the timer: the line drops.
        let u = timer.write(CntReg::VTval, 1000, at).unwrap();
        redist.set_ppi_line(VTIMER_PPI, u.level).unwrap();
        vif.guest_eoir(27, None, &mut dist, &mut redist).unwrap();
        assert!(!redist.bank().is_active(VTIMER_PPI));
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), SPURIOUS);
    }

    /// kvm-unit-tests arm/timer.c (`test_timer_pending`, the GIC side):
    /// the timer's output is a level into PPI 27 at the core's
    /// redistributor. Expired but masked (IMASK): ISTATUS set, nothing
    /// pending at the GIC; unmasked: pending; acknowledged: active and no
    /// longer signalled; masked again: the line drops, pending stays clear,
    /// and a deactivation leaves the PPI idle; moving CVAL into the future
    /// drops it too.
    #[test]
    fn timer_interrupt_and_its_mask_at_the_gic() {
        use super::timer::{CTL_IMASK, CTL_ISTATUS};
        let p = GicParams::gicv3(1);
        let mut dist = Distributor::new(&p);
        let mut redist = Redistributor::new(0, &p);
        redist.configure(VTIMER_PPI, 0xA0, Group::G1).unwrap();
        let mut cpu = CpuInterface::new(0, &p).linux_host(true);
        let mut timer = GenericTimer::new(&p.timer);
        let now = 1_000_000; // 1 µs: count 100
        timer.write(CntReg::VCval, 50, now).unwrap();
        let u = timer
            .write(CntReg::VCtl, CTL_ENABLE | CTL_IMASK, now)
            .unwrap();
        redist.set_ppi_line(VTIMER_PPI, u.level).unwrap();
        assert_ne!(timer.read(CntReg::VCtl, now) & CTL_ISTATUS, 0);
        assert!(!redist.bank().is_pending(VTIMER_PPI), "masked");
        assert!(!cpu.irq_line(&dist, &redist));
        let u = timer.write(CntReg::VCtl, CTL_ENABLE, now).unwrap();
        assert!(redist.set_ppi_line(VTIMER_PPI, u.level).unwrap());
        assert!(redist.bank().is_pending(VTIMER_PPI));
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), VTIMER_PPI);
        assert!(redist.bank().is_active(VTIMER_PPI));
        assert!(!cpu.irq_line(&dist, &redist), "active: not signalled");
        // The handler masks the timer (arch_timer_handler_virt), then EOIs.
        let u = timer
            .write(CntReg::VCtl, CTL_ENABLE | CTL_IMASK, now)
            .unwrap();
        redist.set_ppi_line(VTIMER_PPI, u.level).unwrap();
        cpu.write_eoir1(VTIMER_PPI, &mut dist, &mut redist).unwrap();
        cpu.write_dir(VTIMER_PPI, &mut dist, &mut redist).unwrap();
        assert!(!redist.bank().is_pending(VTIMER_PPI));
        assert!(!redist.bank().is_active(VTIMER_PPI));
        assert_eq!(cpu.read_iar1(&mut dist, &mut redist), SPURIOUS);
        // Unmasked again with CVAL in the future: nothing until it expires.
        timer.write(CntReg::VCval, 1_000, now).unwrap();
        let u = timer.write(CntReg::VCtl, CTL_ENABLE, now).unwrap();
        redist.set_ppi_line(VTIMER_PPI, u.level).unwrap();
        assert!(!redist.bank().is_pending(VTIMER_PPI));
        let (at, gen) = u.arm.expect("armed");
        let level = timer.expired(TimerChannel::Virtual, at, gen).unwrap();
        assert!(redist.set_ppi_line(VTIMER_PPI, level).unwrap());
        assert!(cpu.irq_line(&dist, &redist));
    }

    #[test]
    fn msi_through_its_to_resident_vpe_or_doorbell() {
        let p = GicParams::gicv4(2, 4);
        let mut config = LpiConfigTable::new(p.redistributor.lpis);
        config.set(8192, 0x80, true).unwrap(); // the doorbell
        let mut redists: Vec<_> = (0..2).map(|c| Redistributor::new(c, &p)).collect();
        for r in &mut redists {
            r.set_lpis_enabled(true, &config);
        }
        let mut vlpis = VlpiTables::for_params(&p);
        vlpis.set_config(1, 8300, 0x40, true).unwrap();
        let mut its = Its::new(&p);
        its.set_enabled(true);
        let mut t = ItsTargets {
            redists: &mut redists,
            lpi_config: &config,
            vlpis: &mut vlpis,
        };
        for c in [
            ItsCommand::Mapd {
                device: 0,
                size: 4,
                valid: true,
            },
            ItsCommand::Vmapp {
                vpeid: 1,
                target: 1,
                valid: true,
                default_doorbell: None,
            },
            ItsCommand::Vmapti {
                device: 0,
                event: 3,
                vpeid: 1,
                vintid: 8300,
                doorbell: Some(8192),
            },
        ] {
            its.command(c, &mut t).unwrap();
        }
        // vCPU not running: the doorbell reaches the host on core 1.
        assert!(matches!(
            its.translate(0, 3, &mut t),
            MsiOutcome::VlpiPending {
                core: 1,
                doorbell: Some(_),
                ..
            }
        ));
        let mut dist = Distributor::new(&p);
        let mut cpu = CpuInterface::new(1, &p).linux_host(true);
        assert_eq!(cpu.read_iar1(&mut dist, &mut t.redists[1]), 8192);
        cpu.write_eoir1(8192, &mut dist, &mut t.redists[1]).unwrap();
        // The host schedules the vCPU in: the vLPI is there, no LR needed.
        t.redists[1].make_resident(1, t.vlpis).unwrap();
        let mut vif = VcpuInterface::new(&p).kvm_linux_guest();
        let mut d = t.redists[1].direct_vlpis(t.vlpis).unwrap();
        assert!(vif.virq_line(Some(&d)));
        assert_eq!(vif.read_iar1(Some(&mut d)), 8300);
        vif.write_eoir(8300, Some(&mut d)).unwrap();
        // While running, further MSIs go straight in: no doorbell, no exit.
        assert!(matches!(
            its.translate(0, 3, &mut t),
            MsiOutcome::VlpiResident { core: 1, .. }
        ));
        assert!(!t.redists[1].lpi_pending(8192));
        assert_eq!(vif.counters().lr_writes, 0);
    }
}
