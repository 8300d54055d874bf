//! Exits per guest event under each RISC-V scheme, from the mechanisms.

use super::*;
use crate::hv::riscv::RiscvExitReason;

/// A scheme variant: name, config, guest files per hart.
struct Variant {
    label: &'static str,
    scheme: &'static str,
    cfg: RiscvConfig,
    geilen: usize,
}

fn variants() -> Vec<Variant> {
    let v = |label, scheme, cfg, geilen| Variant {
        label,
        scheme,
        cfg,
        geilen,
    };
    let no_sstc = RiscvConfig {
        no_sstc: true,
        ..Default::default()
    };
    vec![
        v(
            "kvm-riscv (HW file)",
            "kvm-riscv",
            RiscvConfig::default(),
            2,
        ),
        v(
            "kvm-riscv (SW file)",
            "kvm-riscv",
            RiscvConfig::default(),
            0,
        ),
        v("kvm-riscv (no Sstc)", "kvm-riscv", no_sstc, 2),
        v("kvm-riscv-sw", "kvm-riscv-sw", RiscvConfig::default(), 2),
        v("did-riscv", "did-riscv", RiscvConfig::default(), 2),
    ]
}

/// Exits per event, in table order: timer programming, timer expiry,
/// device interrupt (delivery and claim), its end of interrupt (the PLIC's
/// completion), IPI to a running vCPU, idle, device interrupt to an idle
/// vCPU (all of it). Two vCPUs on two harts.
fn table_row(v: &Variant) -> ([usize; 7], Vec<(usize, Handled)>) {
    let mut s = HsStepper::new(v.scheme, v.cfg, 2, v.geilen, &[0, 1]).unwrap();
    let mut row = [0; 7];
    let mut seen = Vec::new();
    let events = [
        GuestEvent::TimerProgram { vcpu: 0, at: 1000 },
        GuestEvent::TimerExpiry { vcpu: 0 },
        GuestEvent::Device { vcpu: 0 },
        GuestEvent::Ipi { from: 1, to: 0 },
        GuestEvent::Idle { vcpu: 0 },
        GuestEvent::Device { vcpu: 0 },
    ];
    let completion = |e: &RiscvExit| matches!(e, RiscvExit::GuestPageFault { store: true, gpa, .. } if *gpa == plic_claim_complete(0));
    for (i, ev) in events.into_iter().enumerate() {
        let exits = s.step(ev);
        let col = if i >= 3 { i + 1 } else { i };
        if i == 2 {
            row[3] = exits.iter().filter(|(_, e)| completion(e)).count();
            row[2] = exits.len() - row[3];
        } else {
            row[col] = exits.len();
        }
        seen.extend_from_slice(s.handled());
    }
    assert_eq!(s.msi_faults, 0);
    (row, seen)
}

#[test]
fn every_event_reaches_its_handler_under_every_scheme() {
    for v in variants() {
        let (_, seen) = table_row(&v);
        let want = [
            Handled::Timer,
            Handled::External(ids::GUEST_VF),
            if v.scheme == "kvm-riscv-sw" {
                Handled::Software
            } else {
                Handled::External(ids::GUEST_IPI)
            },
            Handled::External(ids::GUEST_VF),
        ];
        assert_eq!(seen.len(), want.len(), "{}: {seen:?}", v.label);
        for (got, w) in seen.iter().zip(want) {
            assert_eq!(got, &(0, w), "{}", v.label);
        }
    }
}

#[test]
fn exits_per_guest_event_follow_the_controls() {
    let rows: Vec<_> = variants()
        .iter()
        .map(|v| (v.label, table_row(v).0))
        .collect();
    for (label, r) in &rows {
        println!("{label:24} {r:?}");
    }
    let row = |l: &str| rows.iter().find(|(x, _)| *x == l).unwrap().1;
    // [program, expiry, device, eoi, ipi, idle, device to idle]
    assert_eq!(row("kvm-riscv (HW file)"), [0, 0, 1, 0, 0, 1, 0]);
    assert_eq!(row("kvm-riscv (SW file)"), [0, 0, 2, 0, 3, 1, 1]);
    assert_eq!(row("kvm-riscv (no Sstc)"), [1, 1, 1, 0, 0, 1, 0]);
    assert_eq!(row("kvm-riscv-sw"), [0, 0, 2, 1, 2, 1, 2]);
    assert_eq!(row("did-riscv"), [0; 7]);
}

#[test]
fn the_exits_are_the_ones_kvm_riscv_reports() {
    let mut s = HsStepper::new("kvm-riscv-sw", RiscvConfig::default(), 2, 1, &[0, 1]).unwrap();
    let reasons: Vec<_> = s
        .step(GuestEvent::Device { vcpu: 0 })
        .iter()
        .map(|(_, e)| e.reason())
        .collect();
    assert_eq!(
        reasons,
        [
            RiscvExitReason::Interrupt,
            RiscvExitReason::GuestPageFault,
            RiscvExitReason::GuestPageFault
        ]
    );
    let wfi = s.step(GuestEvent::Idle { vcpu: 1 });
    assert_eq!(wfi, [(1, RiscvExit::VirtualInsn(VirtInsn::Wfi))]);
}

#[test]
fn more_vcpus_than_guest_files_puts_the_last_on_the_software_file() {
    // One hart with one guest file, two vCPUs on it: the second loaded
    // gets KVM's software file (AUTO mode).
    let mut s = HsStepper::new("kvm-riscv", RiscvConfig::default(), 1, 1, &[0, 0]).unwrap();
    assert!(s.is_running(1));
    assert_eq!(s.vcpus[1].file, crate::hv::riscv::FileHome::Sw);
    assert_eq!(s.step(GuestEvent::Device { vcpu: 1 }).len(), 2);
    assert_eq!(s.handled(), [(1, Handled::External(ids::GUEST_VF))]);
    // vCPU 0 holds the file while it waits; back on the hart, it still
    // has it: a device interrupt costs the host's SEI only.
    s.resume_on(0, 0);
    assert_eq!(s.step(GuestEvent::Device { vcpu: 0 }).len(), 1);
}

fn migrate(drop_pending: bool) -> HsStepper {
    let cfg = RiscvConfig {
        migrate_drop_pending: drop_pending,
        ..Default::default()
    };
    let mut s = HsStepper::new("kvm-riscv", cfg, 2, 1, &[0]).unwrap();
    s.preempt(0);
    // The VF's MSI while the vCPU waits: the host injects it into the
    // guest file it left on hart 0.
    s.step(GuestEvent::Device { vcpu: 0 });
    assert!(s.handled().is_empty());
    s.resume_on(0, 1);
    s
}

#[test]
fn a_migrated_vcpu_takes_what_was_pending_in_its_old_file() {
    let s = migrate(false);
    assert_eq!(s.handled(), [(0, Handled::External(ids::GUEST_VF))]);
}

#[test]
fn a_migration_that_drops_the_old_files_pending_bits_loses_the_interrupt() {
    let s = migrate(true);
    assert!(s.handled().is_empty(), "lost: {:?}", s.handled());
}

#[test]
fn did_riscv_refuses_two_vcpus_on_one_hart() {
    let two = HsStepper::new("did-riscv", RiscvConfig::default(), 2, 2, &[0, 0]);
    assert!(two.is_err_and(|e| e.contains("share hart 0")));
    assert!(HsStepper::new("kvm-riscv", RiscvConfig::default(), 2, 2, &[0, 0]).is_ok());
}
