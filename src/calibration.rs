//! The calibration file: every primitive cost of the model, each with its
//! source. Loaded from `calibration/x86-did-host.toml` (embedded in the
//! binary; a user may pass another file). Outcomes never live here.

use serde::{Deserialize, Serialize};

/// One calibrated primitive: its value and where the value comes from.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The number, in the unit the key names.
    pub value: f64,
    /// Provenance: `[paper]`, `[public]` or `[estimate]` and a reference.
    pub source: String,
}

macro_rules! section {
    ($name:ident { $($field:ident),* $(,)? }) => {
        #[doc = concat!("Calibration section `", stringify!($name), "`.")]
        #[derive(Clone, Debug, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        #[allow(missing_docs)]
        pub struct $name { $(pub $field: Entry,)* }
    };
}

section!(Cpu { ghz });
section!(Vmx {
    exit_entry_roundtrip_us
});
section!(Exit {
    external_interrupt_us,
    msr_write_eoi_us,
    msr_write_tmict_us,
    msr_write_other_us,
    io_instruction_us,
    io_instruction_ioeventfd_us,
    ept_violation_us,
    pending_interrupt_us,
    exception_np_us,
    nmi_us,
    hlt_us,
});
section!(Host {
    hz,
    vcpu_wakeup_us,
    tick_handler_us,
    hrtimer_interrupt_us,
    kvm_timer_fn_us,
    irq_handler_us,
    ipi_latency_us,
    self_ipi_us,
    irt_update_us,
});
section!(Guest {
    irq_entry_ns,
    irq_exit_ns,
    eoi_write_ns,
    tmict_write_ns,
    hrtimer_interrupt_ns,
    tick_handler_ns,
    vf_irq_handler_ns,
    napi_poll_base_ns,
    rx_per_packet_ns,
    itr_update_ns,
    udp_recv_per_packet_ns,
    context_switch_ns,
    syscall_ns,
    tcp_rx_segment_ns,
    tcp_tx_segment_ns,
    udp_tx_datagram_ns,
    virtio_xmit_ns,
    vf_xmit_ns,
    copy_per_kib_ns,
    memcached_get_ns,
    memcached_set_ns,
    sip_message_ns,
    sip_auth_ns,
    blk_submit_ns,
    blk_complete_ns,
    cyclictest_loop_ns,
    whileloop_cycles_per_iter,
});
section!(Background {
    io_instruction_per_s,
    ept_violation_per_s,
});
section!(Nic {
    itr_unit_us,
    itr_lowest_reg,
    itr_low_reg,
    itr_bulk_reg,
    itr_low_threshold_bytes_per_us,
    itr_bulk_threshold_bytes_per_us,
    rx_ring_size,
    rx_refill_batch,
    napi_weight,
    netdev_budget,
    msi_latency_us,
    tx_fetch_us,
    veb_loopback_us,
    link_gbps,
});
section!(Apic { bus_mhz });
section!(Vhost {
    wakeup_us,
    tx_per_frame_ns,
    rx_per_frame_ns,
    signal_ns,
    poll_iteration_ns,
    tap_queue_frames,
});
section!(Blk {
    wakeup_us,
    request_us,
    copy_per_kib_ns,
});
section!(Peer {
    rx_segment_ns,
    tx_segment_ns,
    wakeup_us,
    bridge_ns,
    udp_rx_datagram_ns,
    udp_tx_datagram_ns,
    sipp_message_ns,
});

/// The whole calibration.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Calibration {
    pub cpu: Cpu,
    pub vmx: Vmx,
    pub exit: Exit,
    pub host: Host,
    pub guest: Guest,
    pub background: Background,
    pub nic: Nic,
    pub apic: Apic,
    pub vhost: Vhost,
    pub peer: Peer,
    pub blk: Blk,
}

/// The calibration shipped with exitless.
pub const DEFAULT_TOML: &str = include_str!("../calibration/x86-did-host.toml");

/// Errors reading a calibration file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// The TOML did not parse or a key is missing, unknown or mistyped.
    #[error("calibration: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value is negative or not finite.
    #[error("calibration: {key} = {value} must be a finite, non-negative number")]
    Bad {
        /// Dotted key.
        key: String,
        /// Offending value.
        value: f64,
    },
}

impl Calibration {
    /// Parses and checks a calibration file's text.
    pub fn from_toml(text: &str) -> Result<Self, CalibrationError> {
        let c: Calibration = toml::from_str(text)?;
        let v = toml::Value::try_from(&c).map_err(|e| CalibrationError::Bad {
            key: e.to_string(),
            value: f64::NAN,
        })?;
        check(&v, "")?;
        Ok(c)
    }

    /// The shipped calibration.
    pub fn default_host() -> Self {
        Self::from_toml(DEFAULT_TOML).expect("shipped calibration parses")
    }
}

fn check(v: &toml::Value, path: &str) -> Result<(), CalibrationError> {
    if let Some(t) = v.as_table() {
        if let (Some(x), Some(_)) = (t.get("value"), t.get("source")) {
            let x = x
                .as_float()
                .or(x.as_integer().map(|i| i as f64))
                .unwrap_or(f64::NAN);
            if !x.is_finite() || x < 0.0 {
                return Err(CalibrationError::Bad {
                    key: path.to_string(),
                    value: x,
                });
            }
            return Ok(());
        }
        for (k, c) in t {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            check(c, &p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_parses_and_every_entry_has_a_tagged_source() {
        let c = Calibration::default_host();
        assert_eq!(c.exit.external_interrupt_us.value, 1.97);
        let v = toml::Value::try_from(&c).unwrap();
        fn walk(v: &toml::Value, n: &mut usize) {
            let t = v.as_table().unwrap();
            if let Some(s) = t.get("source") {
                let s = s.as_str().unwrap();
                assert!(
                    s.starts_with("[paper]")
                        || s.starts_with("[public]")
                        || s.starts_with("[estimate]"),
                    "untagged source {s}"
                );
                *n += 1;
                return;
            }
            for c in t.values() {
                walk(c, n);
            }
        }
        let mut n = 0;
        walk(&v, &mut n);
        assert!(n > 40, "{n} entries");
    }

    #[test]
    fn negative_values_and_unknown_keys_are_rejected() {
        let bad = DEFAULT_TOML.replacen("value = 1.97", "value = -1.97", 1);
        let e = Calibration::from_toml(&bad).unwrap_err().to_string();
        assert!(e.contains("exit.external_interrupt_us"), "{e}");
        let unknown = format!("{DEFAULT_TOML}\n[extra]\nx = {{ value = 1, source = \"s\" }}\n");
        assert!(Calibration::from_toml(&unknown).is_err());
    }
}
