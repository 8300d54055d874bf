//! Calibration overlays: a partial calibration file and `key=value`
//! settings layered, in that order, over the shipped calibration.
//!
//! An overlay names only the entries it changes; every other entry keeps
//! the shipped value and source. In an overlay file an entry is written as
//! in the shipped file (`msr_write_eoi_us = { value = 1.2, source = "..." }`),
//! or as a bare number, or as `{ value = ... }` alone, whose source then
//! names the file. A key the calibration does not have is an error naming
//! it; the layered result is range-checked as a whole file is
//! ([`crate::calibration::range_of`]).
//!
//! The ARM host's calibration (`calibration/arm-kvm-host.toml`, carried
//! as [`Calibration::arm`]) is reached by the same dotted keys and rules:
//! a key goes to the x86 file if that has it, else to the ARM file
//! (`kvm.halt_poll_us`, `gic.its_translate_ns`, `guest.virtual_eoi_ns`).
//! The two files share only the `[guest]` section's name, and no key.

use crate::calibration::{
    ArmCalibration, Calibration, RiscvCalibration, ARM_DEFAULT_TOML, DEFAULT_TOML,
    RISCV_DEFAULT_TOML,
};

/// The sections of the RISC-V file (`calibration/riscv-kvm-host.toml`),
/// which shares no section name with the ARM file: an overlay reaches
/// both through one table of the non-x86 files, split again on apply.
const RISCV_SECTIONS: [&str; 3] = ["hs", "kvm_riscv", "aia"];

/// One overlaid entry: dotted key, value, source.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlayEntry {
    /// `section.name`.
    pub key: String,
    /// The new value.
    pub value: f64,
    /// Where it comes from (stored as the entry's `source`).
    pub source: String,
    /// The clock tag it gives (`at_ghz = ...` or `wall = true`); `None`
    /// keeps the shipped entry's.
    pub clock: Option<Clock>,
}

/// A cost's clock tag in an overlay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Clock {
    /// Cycle-bound, measured at this many GHz.
    AtGhz(f64),
    /// Wall-time bound.
    Wall,
}

fn default_table() -> toml::Table {
    // The shipped file parses (a unit test of `calibration` says so).
    toml::from_str(DEFAULT_TOML).unwrap_or_default()
}

fn default_arm_table() -> toml::Table {
    // The shipped ARM and RISC-V files parse (unit tests of `calibration`
    // say so); their sections are apart.
    let mut t: toml::Table = toml::from_str(ARM_DEFAULT_TOML).unwrap_or_default();
    t.extend(toml::from_str::<toml::Table>(RISCV_DEFAULT_TOML).unwrap_or_default());
    t
}

/// Which calibration file an overlaid key belongs to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    X86,
    Arm,
}

/// Every dotted key of the shipped calibrations (x86, then ARM), in file
/// order of sections and sorted within them.
pub fn known_keys() -> Vec<String> {
    let mut v = Vec::new();
    for (sec, t) in default_table().into_iter().chain(default_arm_table()) {
        if let Some(t) = t.as_table() {
            v.extend(t.keys().map(|k| format!("{sec}.{k}")));
        }
    }
    v
}

/// Checks that `key` (dotted) is an entry of the x86 calibration `base`
/// or, failing that, of the ARM one `arm`, and says which; the error names
/// the key and what the section holds (or the sections of both files).
fn check_key(
    base: &toml::Table,
    arm: &toml::Table,
    key: &str,
    origin: &str,
) -> Result<Target, String> {
    let (sec, name) = key.split_once('.').ok_or_else(|| {
        format!("{origin}: `{key}` is not a calibration key (expected section.name, e.g. exit.msr_write_eoi_us or kvm.halt_poll_us)")
    })?;
    let section = |t: &toml::Table| t.get(sec).and_then(|t| t.as_table()).cloned();
    match (section(base), section(arm)) {
        (Some(s), _) if s.contains_key(name) => Ok(Target::X86),
        (_, Some(s)) if s.contains_key(name) => Ok(Target::Arm),
        (None, None) => Err(format!(
            "{origin}: unknown calibration key `{key}`: no section `[{sec}]` ({})",
            sections(base, arm)
        )),
        (x, a) => {
            // Marked ARM where both files have the section ([guest]).
            let both = x.is_some() && a.is_some();
            let mut names: Vec<String> = Vec::new();
            if let Some(x) = x {
                names.extend(x.keys().cloned());
            }
            if let Some(a) = a {
                names.extend(a.keys().map(|k| match both {
                    true => format!("{k} (ARM)"),
                    false => k.clone(),
                }));
            }
            Err(format!(
                "{origin}: unknown calibration key `{key}` ([{sec}] has {})",
                names.join(", ")
            ))
        }
    }
}

/// The sections of the files, in words, for an error.
fn sections(base: &toml::Table, arm: &toml::Table) -> String {
    let x: Vec<&str> = base.keys().map(|s| s.as_str()).collect();
    let (r, a): (Vec<&str>, Vec<&str>) = arm
        .keys()
        .map(|s| s.as_str())
        .partition(|s| RISCV_SECTIONS.contains(s));
    format!(
        "sections: {}; ARM sections: {}; RISC-V sections: {}",
        x.join(", "),
        a.join(", "),
        r.join(", ")
    )
}

fn number(v: &toml::Value) -> Option<f64> {
    v.as_float().or(v.as_integer().map(|i| i as f64))
}

/// Parses an overlay file's text. `origin` (the file's name) prefixes
/// every message and is the source of entries that give none.
pub fn parse_overlay(text: &str, origin: &str) -> Result<Vec<OverlayEntry>, String> {
    let base = default_table();
    let arm = default_arm_table();
    let t: toml::Table = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
    let mut out = Vec::new();
    for (sec, entries) in &t {
        let Some(entries) = entries.as_table() else {
            return Err(format!(
                "{origin}: `{sec}` must be a table of entries (`[{sec}]`), not a value"
            ));
        };
        if !base.contains_key(sec) && !arm.contains_key(sec) {
            return Err(format!(
                "{origin}: unknown calibration section `[{sec}]` ({})",
                sections(&base, &arm)
            ));
        }
        for (name, e) in entries {
            let key = format!("{sec}.{name}");
            check_key(&base, &arm, &key, origin)?;
            let mut clock = None;
            let (value, source) = match e {
                toml::Value::Table(et) => {
                    let fields = ["value", "source", "at_ghz", "wall"];
                    if let Some(k) = et.keys().find(|k| !fields.contains(&k.as_str())) {
                        return Err(format!(
                            "{origin}: `{key}`: unknown field `{k}` (an entry has `value` and `source`, and a cost `at_ghz` or `wall`)"
                        ));
                    }
                    match (et.get("at_ghz").and_then(number), et.get("wall")) {
                        (Some(g), None) => clock = Some(Clock::AtGhz(g)),
                        (None, Some(toml::Value::Boolean(true))) => clock = Some(Clock::Wall),
                        (None, None) => {}
                        _ => {
                            return Err(format!(
                            "{origin}: `{key}`: give `at_ghz = <GHz>` or `wall = true`, not both"
                        ))
                        }
                    }
                    let v = et
                        .get("value")
                        .ok_or_else(|| format!("{origin}: `{key}`: missing `value`"))?;
                    let source = match et.get("source") {
                        None => format!("[overlay] {origin}"),
                        Some(toml::Value::String(s)) => s.clone(),
                        Some(_) => {
                            return Err(format!("{origin}: `{key}.source` must be a string"))
                        }
                    };
                    (v, source)
                }
                v => (v, format!("[overlay] {origin}")),
            };
            let value = number(value)
                .ok_or_else(|| format!("{origin}: `{key}`: value {value} is not a number"))?;
            out.push(OverlayEntry {
                key,
                value,
                source,
                clock,
            });
        }
    }
    Ok(out)
}

/// Parses a `--calibration-set section.name=VALUE`.
pub fn parse_set(kv: &str) -> Result<OverlayEntry, String> {
    let (k, v) = kv.split_once('=').ok_or_else(|| {
        format!(
            "--calibration-set `{kv}`: expected section.name=VALUE, e.g. exit.msr_write_eoi_us=1.2"
        )
    })?;
    let key = k.trim().to_string();
    check_key(
        &default_table(),
        &default_arm_table(),
        &key,
        "--calibration-set",
    )?;
    let value: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("--calibration-set `{kv}`: `{}` is not a number", v.trim()))?;
    Ok(OverlayEntry {
        source: format!("[overlay] --calibration-set {key}={}", v.trim()),
        key,
        value,
        clock: None,
    })
}

/// The shipped calibration with `entries` applied in order (a later one
/// wins), range-checked.
pub fn apply(entries: &[OverlayEntry]) -> Result<Calibration, String> {
    apply_table(default_table(), default_arm_table(), entries)
}

/// `cal` with `entries` applied in order, range-checked: a paper's
/// testbed overlay over whatever calibration the command line gave.
pub fn apply_to(cal: &Calibration, entries: &[OverlayEntry]) -> Result<Calibration, String> {
    let base = toml::Table::try_from(cal).map_err(|e| e.to_string())?;
    let mut arm = toml::Table::try_from(&cal.arm).map_err(|e| e.to_string())?;
    arm.extend(toml::Table::try_from(&cal.riscv).map_err(|e| e.to_string())?);
    apply_table(base, arm, entries)
}

fn apply_table(
    mut base: toml::Table,
    mut arm: toml::Table,
    entries: &[OverlayEntry],
) -> Result<Calibration, String> {
    for e in entries {
        let file = match check_key(&base, &arm, &e.key, "calibration overlay")? {
            Target::X86 => &mut base,
            Target::Arm => &mut arm,
        };
        let (sec, name) = e.key.split_once('.').unwrap_or(("", ""));
        let mut entry = toml::Table::new();
        entry.insert("value".into(), toml::Value::Float(e.value));
        entry.insert("source".into(), toml::Value::String(e.source.clone()));
        if let Some(s) = file.get_mut(sec).and_then(|t| t.as_table_mut()) {
            // The clock tag: the overlay's, else the entry's it replaces.
            let old = s.get(name).and_then(|o| o.as_table());
            match e.clock {
                Some(Clock::AtGhz(g)) => {
                    entry.insert("at_ghz".into(), toml::Value::Float(g));
                }
                Some(Clock::Wall) => {
                    entry.insert("wall".into(), toml::Value::Boolean(true));
                }
                None => {
                    for k in ["at_ghz", "wall"] {
                        if let Some(x) = old.and_then(|o| o.get(k)) {
                            entry.insert(k.into(), x.clone());
                        }
                    }
                }
            }
            s.insert(name.to_string(), toml::Value::Table(entry));
        }
    }
    let text = toml::to_string(&base).map_err(|e| e.to_string())?;
    let mut cal = Calibration::from_toml(&text).map_err(|e| e.to_string())?;
    let (riscv, arm): (toml::Table, toml::Table) = arm
        .into_iter()
        .partition(|(sec, _)| RISCV_SECTIONS.contains(&sec.as_str()));
    let text = toml::to_string(&arm).map_err(|e| e.to_string())?;
    cal.arm = ArmCalibration::from_toml(&text).map_err(|e| format!("ARM {e}"))?;
    let text = toml::to_string(&riscv).map_err(|e| e.to_string())?;
    cal.riscv = RiscvCalibration::from_toml(&text).map_err(|e| format!("RISC-V {e}"))?;
    Ok(cal)
}

/// The calibration the command line asks for: the shipped one, then the
/// overlay file (`origin`, `text`) if any, then the `--calibration-set`
/// settings.
pub fn layered(file: Option<(&str, &str)>, sets: &[String]) -> Result<Calibration, String> {
    let mut entries = Vec::new();
    if let Some((origin, text)) = file {
        entries.extend(parse_overlay(text, origin)?);
    }
    for s in sets {
        entries.push(parse_set(s)?);
    }
    apply(&entries).map_err(|e| match file {
        Some((origin, _)) if !sets.is_empty() => {
            format!("{e} (after {origin} and --calibration-set)")
        }
        Some((origin, _)) => format!("{origin}: {e}"),
        None if !sets.is_empty() => format!("--calibration-set: {e}"),
        None => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paper's testbed overlay goes over the calibration in use (itself
    /// layered), not over the shipped one.
    #[test]
    fn a_testbed_overlay_layers_over_the_calibration_in_use() {
        let mine = layered(None, &["exit.hlt_us=2.5".to_string()]).unwrap();
        let tb = parse_overlay("[nic]\nlink_gbps = 40\n", "testbed.toml").unwrap();
        let c = apply_to(&mine, &tb).unwrap();
        assert_eq!(c.nic.link_gbps.value, 40.0);
        assert_eq!(c.exit.hlt_us.value, 2.5, "the user's setting survives");
        let bad = parse_overlay("[nic]\nlink_gbps = -1\n", "testbed.toml").unwrap();
        assert!(apply_to(&mine, &bad).is_err(), "range-checked");
    }

    #[test]
    fn a_partial_file_changes_only_its_entries() {
        let d = Calibration::default_host();
        let c = layered(
            Some((
                "ov.toml",
                "[exit]\nmsr_write_eoi_us = { value = 1.2, source = \"[measured] mine\" }\nhlt_us = 2\n[cpu]\nghz = { value = 2.5 }\n",
            )),
            &[],
        )
        .unwrap();
        assert_eq!(c.exit.msr_write_eoi_us.value, 1.2);
        assert_eq!(c.exit.msr_write_eoi_us.source, "[measured] mine");
        assert_eq!(c.exit.hlt_us.value, 2.0);
        assert!(c.exit.hlt_us.source.contains("ov.toml"));
        assert_eq!(c.cpu.ghz.value, 2.5);
        assert!(c.cpu.ghz.source.contains("ov.toml"));
        // Everything else is the shipped calibration's.
        assert_eq!(
            c.exit.external_interrupt_us.value,
            d.exit.external_interrupt_us.value
        );
        assert_eq!(c.nic.rx_ring_size.value, d.nic.rx_ring_size.value);
        assert_eq!(c.host.hz.source, d.host.hz.source);
    }

    /// An overlay entry keeps the clock tag of the entry it replaces
    /// unless it gives its own.
    #[test]
    fn an_overlay_entry_keeps_or_sets_the_clock_tag() {
        let text = "[exit]\nexternal_interrupt_us = 2.0\nmsr_write_eoi_us = { value = 1.0, wall = true }\nnmi_us = { value = 0.5, at_ghz = 2.0 }\n";
        let c = apply(&parse_overlay(text, "t.toml").unwrap()).unwrap();
        assert_eq!(c.exit.external_interrupt_us.at_ghz, Some(3.4));
        assert!(c.exit.msr_write_eoi_us.wall);
        assert_eq!(c.exit.msr_write_eoi_us.at_ghz, None);
        assert_eq!(c.exit.nmi_us.at_ghz, Some(2.0));
        let both = "[exit]\nnmi_us = { value = 0.5, at_ghz = 2.0, wall = true }\n";
        assert!(parse_overlay(both, "t.toml")
            .unwrap_err()
            .contains("not both"));
    }

    #[test]
    fn sets_win_over_the_file() {
        let c = layered(
            Some(("ov.toml", "[exit]\nmsr_write_eoi_us = 1.2\n")),
            &["exit.msr_write_eoi_us=1.5".into(), "cpu.ghz = 3".into()],
        )
        .unwrap();
        assert_eq!(c.exit.msr_write_eoi_us.value, 1.5);
        assert!(c.exit.msr_write_eoi_us.source.contains("--calibration-set"));
        assert_eq!(c.cpu.ghz.value, 3.0);
    }

    #[test]
    fn unknown_keys_bad_values_and_ranges_are_errors_naming_the_key() {
        for (file, needle) in [
            ("[exit]\nmsr_write_eio_us = 1\n", "exit.msr_write_eio_us"),
            ("[exitz]\nhlt_us = 1\n", "[exitz]"),
            ("[exit]\nhlt_us = \"fast\"\n", "exit.hlt_us"),
            ("[exit]\nhlt_us = { value = 1, sauce = \"x\" }\n", "sauce"),
            ("[exit]\nhlt_us = { source = \"x\" }\n", "missing `value`"),
            ("exit = 3\n", "`exit`"),
            ("[nonsense]\n", "[nonsense]"),
            ("[exit]\nhlt_us = -1\n", "exit.hlt_us"),
            ("[nic]\nrx_ring_size = 100.5\n", "nic.rx_ring_size"),
            ("[cpu]\nghz = 0\n", "cpu.ghz"),
        ] {
            let e = layered(Some(("ov.toml", file)), &[])
                .map(|_| ())
                .unwrap_err();
            assert!(e.contains(needle) && e.contains("ov.toml"), "{file}: {e}");
        }
        for (set, needle) in [
            ("exit.nope_us=1", "exit.nope_us"),
            ("exit.hlt_us=abc", "abc"),
            ("exit.hlt_us", "section.name=VALUE"),
            ("hlt_us=1", "hlt_us"),
            ("exit.hlt_us=nan", "exit.hlt_us"),
            ("exit.hlt_us=1e9", "out of range"),
        ] {
            let e = layered(None, &[set.into()]).map(|_| ()).unwrap_err();
            assert!(e.contains(needle), "{set}: {e}");
        }
    }

    #[test]
    fn arm_keys_go_to_the_arm_calibration_and_x86_keys_stay_x86() {
        let c = layered(
            Some((
                "ov.toml",
                "[kvm]\nhalt_poll_us = 0\n[guest]\nvirtual_eoi_ns = 7\n",
            )),
            &["gic.its_translate_ns=300".into(), "exit.hlt_us=2".into()],
        )
        .unwrap();
        assert_eq!(c.arm.kvm.halt_poll_us.value, 0.0);
        assert_eq!(c.arm.guest.virtual_eoi_ns.value, 7.0);
        assert_eq!(c.arm.gic.its_translate_ns.value, 300.0);
        assert_eq!(c.exit.hlt_us.value, 2.0);
        let shipped = ArmCalibration::default_arm();
        assert_eq!(
            c.arm.el2.world_switch_ns.value,
            shipped.el2.world_switch_ns.value
        );
        // Carried through a testbed overlay and the clock scaling.
        let c2 = apply_to(&c, &[parse_set("cpu.ghz=2.0").unwrap()]).unwrap();
        assert_eq!(c2.at_cpu_clock().arm.kvm.halt_poll_us.value, 0.0);
        let changed = c2.changes_from_shipped();
        assert!(changed.contains_key("kvm.halt_poll_us"), "{changed:?}");
        // The whole shipped ARM file is an overlay that changes nothing.
        let all = layered(Some(("arm.toml", ARM_DEFAULT_TOML)), &[]).unwrap();
        assert!(all.changes_from_shipped().is_empty());
        for (set, needle) in [
            ("kvm.nope_ns=1", "[kvm] has"),
            ("guest.nope_ns=1", "virtual_eoi_ns (ARM)"),
            ("gicd.x=1", "ARM sections: el2"),
            ("kvm.halt_poll_us=-1", "kvm.halt_poll_us"),
        ] {
            let e = layered(None, &[set.into()]).map(|_| ()).unwrap_err();
            assert!(e.contains(needle), "{set}: {e}");
        }
    }

    #[test]
    fn the_whole_shipped_file_is_an_overlay_too() {
        let c = layered(Some(("x86.toml", DEFAULT_TOML)), &[]).unwrap();
        let d = Calibration::default_host();
        assert_eq!(toml::to_string(&c).unwrap(), toml::to_string(&d).unwrap());
        assert!(known_keys().contains(&"exit.msr_write_eoi_us".to_string()));
    }
}
