//! Every vector the guest assigns (its LAPIC timer, its VF, its virtio
//! queues) must be its own: two interrupt sources on one vector run one
//! handler for both and the other source's interrupts are never serviced.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::world::World;

fn build(file: &str, sets: &[&str]) -> Result<World, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::load(&scenario_path(file), &sets).expect("scenario loads");
    World::build(&s, &Calibration::default_host()).map_err(|e| e.to_string())
}

fn refused(file: &str, sets: &[&str]) -> String {
    build(file, sets)
        .err()
        .unwrap_or_else(|| panic!("{file} {sets:?} must not build"))
}

#[test]
fn a_guest_vector_on_a_virtio_queue_vector_is_refused() {
    // virtio-net's RX and TX queues (0x51, 0x52) under netpipe.
    for v in ["0x51", "0x52"] {
        let e = refused("netpipe.toml", &[&format!("guest.timer_vector={v}")]);
        assert!(e.contains("guest.timer_vector"), "{e}");
        assert!(e.contains("virtio-net"), "{e}");
    }
    // The virtio-blk disk's request queue (0x53).
    let e = refused("fio.toml", &["guest.timer_vector=0x53"]);
    assert!(e.contains("virtio-blk"), "{e}");
}

#[test]
fn the_spurious_vector_is_refused() {
    let e = refused("fig4.toml", &["guest.vf_vector=0xff"]);
    assert!(e.contains("guest.vf_vector") && e.contains("0xff"), "{e}");
}

#[test]
fn vectors_of_devices_the_scenario_lacks_are_free() {
    // No virtio device over a VF: 0x51 is the VF's to take.
    let r = run_file(
        "netpipe.toml",
        &["net.device=vf", "guest.vf_vector=0x51", "duration_s=0.02"],
    );
    assert!(metric(&r, "netpipe.round_trips") > 100.0);
    // The shipped defaults build everywhere.
    for f in [
        "fig4.toml",
        "netpipe.toml",
        "fio.toml",
        "memcached.toml",
        "sip.toml",
    ] {
        build(f, &[]).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}
