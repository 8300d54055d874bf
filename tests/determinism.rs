//! Same scenario + same seed = byte-identical output.

mod common;
use common::*;

fn json(sets: &[&str]) -> String {
    serde_json::to_string(&run_file("fig4.toml", sets)).unwrap()
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let a = json(&["duration_s=0.1", "scheme=kvm"]);
    let b = json(&["duration_s=0.1", "scheme=kvm"]);
    assert_eq!(a, b);
    let c = json(&["duration_s=0.1", "scheme=kvm", "seed=2"]);
    assert_ne!(a, c, "the background exit stream depends on the seed");
}
