//! Values that pass parsing but that World building must still refuse,
//! with an error naming the key.

use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::world::World;

const UDP: &str =
    "scheme = \"kvm\"\nduration_s = 0.01\nwarmup_s = 0.001\n[workload.udp]\nrate_pps = 10000\n";

fn build_err(cal: &Calibration, sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::parse(UDP, &sets).unwrap();
    match World::build(&s, cal) {
        Ok(_) => panic!("built with {sets:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_calibration_edited_in_code_is_checked_when_the_world_is_built() {
    let mut cal = Calibration::default_host();
    cal.nic.link_gbps.value = 0.0;
    let e = build_err(&cal, &[]);
    assert!(e.contains("nic.link_gbps"), "{e}");
    let mut cal = Calibration::default_host();
    cal.vhost.tap_queue_frames.value = 1e9;
    let e = build_err(&cal, &[]);
    assert!(e.contains("vhost.tap_queue_frames"), "{e}");
}

#[test]
fn a_fixed_itr_interval_must_fit_the_eitr_field_of_this_calibration() {
    // 1022 us in 1-us units is 1022 > 511, the 9-bit field's largest.
    let mut cal = Calibration::default_host();
    cal.nic.itr_unit_us.value = 1.0;
    let e = build_err(&cal, &["nic.itr=fixed", "nic.itr_interval_us=1022"]);
    assert!(e.contains("nic.itr_interval_us"), "{e}");
    let s = Scenario::parse(
        UDP,
        &["nic.itr=fixed".into(), "nic.itr_interval_us=500".into()],
    )
    .unwrap();
    assert!(World::build(&s, &cal).is_ok());
}
