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
    /// A cycle-bound cost: the core clock (GHz) the value holds at. The
    /// model scales it to the experiment's `cpu.ghz`
    /// ([`Calibration::at_cpu_clock`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ghz: Option<f64>,
    /// A wall-time-bound cost (a wire, a device, an interconnect): the
    /// core clock does not change it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wall: bool,
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

section!(Cpu {
    ghz,
    smt_shared_speed
});
section!(Vmx {
    exit_entry_roundtrip_us
});
section!(Svm {
    vmrun_vmexit_roundtrip_us,
    intr_us,
    vintr_us,
    avic_incomplete_ipi_us,
    avic_trap_us,
    avic_load_put_us,
    doorbell_latency_us,
    ga_log_us,
    erratum_1235_window_us,
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
    apic_access_decode_us,
});
section!(Host {
    hz,
    vcpu_wakeup_us,
    tick_handler_us,
    hrtimer_interrupt_us,
    kvm_timer_fn_us,
    irq_handler_us,
    ipi_latency_us,
    ipi_latency_max_us,
    self_ipi_us,
    irt_update_us,
    call_function_us,
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
    gro_merge_ns,
    itr_update_ns,
    udp_recv_per_packet_ns,
    context_switch_ns,
    syscall_ns,
    sendto_syscall_ns,
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
    radiusclient_ns,
    icmp_echo_ns,
    rx_protocol_ns,
    rps_enqueue_ns,
    call_function_ipi_ns,
    nginx_request_ns,
    tcp_conn_request_ns,
    tcp_syn_recv_sock_ns,
    tcp_accept_ns,
    tcp_close_ns,
    http_connection_ns,
    apache_request_ns,
    blk_submit_ns,
    blk_elv_insert_ns,
    blk_dispatch_ns,
    blk_complete_ns,
    fio_io_ns,
    cyclictest_loop_ns,
    posix_timer_signal_ns,
    whileloop_cycles_per_iter,
    cost_cv,
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
    copy_per_kib_ns,
});
section!(Blk {
    wakeup_us,
    submit_us,
    io_us,
    complete_us,
    copy_per_kib_ns,
    thread_create_us,
    paio_lock_ns,
    display_refresh_us,
});
section!(Vcanal {
    inr_build_ns,
    enqueue_ns,
    completion_poll_ns,
    spin_poll_ns,
    sched_yield_ns,
    radix_lookup_ns,
    page_walk_ns,
    dequeue_ns,
    service_per_call_ns,
    port_translation_ns,
    completion_write_ns,
    idle_poll_round_ns,
    pool_dispatch_ns,
    helper_irq_handler_ns,
    host_accept_ns,
    host_epoll_event_ns,
});
section!(Vsock {
    guest_tx_pkt_ns,
    guest_rx_pkt_ns,
    irq_handler_ns,
    tx_pkt_ns,
    rx_pkt_ns,
    copy_per_kib_ns,
    signal_ns,
    relay_syscall_ns,
    relay_select_ns,
    relay_copy_per_kib_ns,
    relay_fork_us,
});
section!(Kvmtool {
    wakeup_us,
    syscall_ns,
    ioeventfd_event_ns,
    tap_write_per_frame_ns,
    tap_read_per_frame_ns,
    copy_per_kib_ns,
    irq_line_ns,
    tun_xmit_ns,
});
section!(Peer {
    rx_segment_ns,
    tx_segment_ns,
    wakeup_us,
    bridge_ns,
    udp_rx_datagram_ns,
    udp_tx_datagram_ns,
    sipp_message_ns,
    radius_request_ns,
    ab_request_ns,
    tcp_connect_ns,
    tcp_close_ns,
    gro_merge_ns,
    rx_itr_us,
});

/// The whole calibration.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Calibration {
    pub cpu: Cpu,
    pub vmx: Vmx,
    /// AMD SVM and AVIC (`kvm-svm`, `kvm-avic`; docs/amd.md).
    pub svm: Svm,
    pub exit: Exit,
    pub host: Host,
    pub guest: Guest,
    pub background: Background,
    pub nic: Nic,
    pub apic: Apic,
    pub vhost: Vhost,
    pub peer: Peer,
    pub blk: Blk,
    pub vcanal: Vcanal,
    pub vsock: Vsock,
    pub kvmtool: Kvmtool,
    /// The ARM host's calibration (its own file,
    /// `calibration/arm-kvm-host.toml`), which ARM worlds use. It is not
    /// part of the x86 file: an overlay reaches its entries by the same
    /// dotted keys (`kvm.halt_poll_us`; see `calibration_overlay`).
    #[serde(skip, default = "ArmCalibration::default_arm")]
    pub arm: ArmCalibration,
    /// The RISC-V host's calibration (its own file,
    /// `calibration/riscv-kvm-host.toml`), which RISC-V worlds use; reached
    /// by an overlay's dotted keys as the ARM file's are.
    #[serde(skip, default = "RiscvCalibration::default_riscv")]
    pub riscv: RiscvCalibration,
}

/// RISC-V section `hs`: the trap path's hardware costs.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RiscvHs {
    pub world_switch_ns: Entry,
    pub insn_decode_ns: Entry,
}

/// RISC-V section `kvm_riscv`: KVM RISC-V's handlers.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RiscvKvm {
    pub swfile_emulate_ns: Entry,
    pub sbi_call_ns: Entry,
    pub mmio_emulate_ns: Entry,
    pub plic_emulate_ns: Entry,
    pub vsfile_move_ns: Entry,
    pub host_irq_ns: Entry,
    pub vcpu_wakeup_us: Entry,
}

/// RISC-V section `aia`: the interrupt fabric.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RiscvAia {
    pub msi_latency_ns: Entry,
    pub timebase_mhz: Entry,
}

/// The RISC-V host's calibration (`calibration/riscv-kvm-host.toml`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RiscvCalibration {
    pub hs: RiscvHs,
    pub kvm_riscv: RiscvKvm,
    pub aia: RiscvAia,
}

/// The RISC-V calibration shipped with exitless.
pub const RISCV_DEFAULT_TOML: &str = include_str!("../calibration/riscv-kvm-host.toml");

impl RiscvCalibration {
    /// Parses and checks a RISC-V calibration file's text.
    pub fn from_toml(text: &str) -> Result<Self, CalibrationError> {
        parse_checked(text)
    }

    /// The shipped RISC-V calibration.
    pub fn default_riscv() -> Self {
        Self::from_toml(RISCV_DEFAULT_TOML).expect("shipped RISC-V calibration parses")
    }
}

/// ARM section `el2`: the exit path's hardware costs.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmEl2 {
    pub world_switch_ns: Entry,
    pub sysreg_decode_ns: Entry,
}

/// ARM section `kvm`: KVM/ARM's handlers.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmKvm {
    pub vgic_emulate_ns: Entry,
    pub host_irq_ns: Entry,
    pub vgic_flush_sync_ns: Entry,
    pub wfi_emulate_ns: Entry,
    pub timer_load_put_ns: Entry,
    pub vgic_load_put_ns: Entry,
    pub vpe_residency_ns: Entry,
    pub doorbell_handler_ns: Entry,
    pub vsgi_send_ns: Entry,
    pub vcpu_wakeup_us: Entry,
    pub halt_poll_us: Entry,
}

/// ARM section `gic`: interrupt-controller latencies.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmGic {
    pub its_translate_ns: Entry,
    pub its_vmovp_ns: Entry,
    pub sgi_latency_ns: Entry,
    pub spi_line_ns: Entry,
}

/// ARM section `guest`: what differs in the guest's own costs.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmGuest {
    pub virtual_eoi_ns: Entry,
}

/// The ARM host's calibration (`calibration/arm-kvm-host.toml`): the
/// primitives of KVM/ARM and the GIC. The guest kernel's path lengths come
/// from the x86 file (the same Linux code).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmCalibration {
    pub el2: ArmEl2,
    pub kvm: ArmKvm,
    pub gic: ArmGic,
    pub guest: ArmGuest,
    pub jetson: ArmJetson,
}

/// ARM section `jetson`: the NVIDIA Jetson Xavier NX board
/// (`[machine] board = "jetson-xavier-nx"`, did-arm.md §4) and its peer.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ArmJetson {
    pub carmel_ghz: Entry,
    pub altra_ghz: Entry,
    pub rpi4_ghz: Entry,
    pub c1_exit_latency_us: Entry,
    pub c6_exit_latency_us: Entry,
    pub c6_min_residency_us: Entry,
    pub halt_poll_max_us: Entry,
    pub halt_poll_grow_start_us: Entry,
    pub mmio_decode_ns: Entry,
    pub link_gbps: Entry,
}

/// The ARM calibration shipped with exitless.
pub const ARM_DEFAULT_TOML: &str = include_str!("../calibration/arm-kvm-host.toml");

impl ArmCalibration {
    /// Parses and checks an ARM calibration file's text (the same range
    /// rules as the x86 file: [`range_of`]).
    pub fn from_toml(text: &str) -> Result<Self, CalibrationError> {
        parse_checked(text)
    }

    /// The shipped ARM calibration.
    pub fn default_arm() -> Self {
        Self::from_toml(ARM_DEFAULT_TOML).expect("shipped ARM calibration parses")
    }
}

/// The Sapphire Rapids host (`calibration/x86-spr-host.toml`): an overlay
/// on the x86 file, for `--calibration` or an experiment file's
/// `calibration` (docs/x86-today.md §5).
pub const SPR_OVERLAY_TOML: &str = include_str!("../calibration/x86-spr-host.toml");

/// The AMD Zen 4 host (`calibration/x86-zen4-host.toml`): an overlay on
/// the x86 file, as the Sapphire Rapids one (docs/amd.md §8).
pub const ZEN4_OVERLAY_TOML: &str = include_str!("../calibration/x86-zen4-host.toml");

/// The calibration shipped with exitless.
pub const DEFAULT_TOML: &str = include_str!("../calibration/x86-did-host.toml");

/// Errors reading a calibration file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// The TOML did not parse or a key is missing, unknown or mistyped.
    #[error("calibration: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value outside its key's range (see [`range_of`]).
    #[error("calibration: {key} = {value} is out of range: must be {range}")]
    OutOfRange {
        /// Dotted key.
        key: String,
        /// Offending value.
        value: f64,
        /// The range, in words.
        range: String,
    },
    /// An entry whose key has no range rule (a new key needs one).
    #[error("calibration: {0} has no range rule")]
    NoRange(String),
    /// Two entries that contradict each other.
    #[error("calibration: {0}")]
    Inconsistent(String),
    /// A cost that says neither the clock it was measured at nor that it
    /// is wall-time bound, or says both.
    #[error("calibration: {0}: a cost gives the core clock it holds at (at_ghz = ...) or is wall-time bound (wall = true), exactly one")]
    Clock(String),
    /// The parsed calibration could not be walked (never expected).
    #[error("calibration: {0}")]
    Internal(String),
}

/// The values a calibration entry may take. A primitive cost or rate may
/// be zero (the primitive is free, the source silent); a frequency, a
/// link speed or a count the model divides or iterates by may not. Upper
/// bounds keep every value far from overflowing the picosecond clock and
/// every size from allocating without bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// Lowest value.
    pub min: f64,
    /// Whether `min` itself is excluded (a value that must be > 0).
    pub min_exclusive: bool,
    /// Highest value.
    pub max: f64,
    /// Whether the value must be a whole number (counts, register values).
    pub integer: bool,
}

impl Range {
    const fn closed(min: f64, max: f64) -> Self {
        Range {
            min,
            min_exclusive: false,
            max,
            integer: false,
        }
    }
    const fn positive(max: f64) -> Self {
        Range {
            min: 0.0,
            min_exclusive: true,
            max,
            integer: false,
        }
    }
    const fn count(min: f64, max: f64) -> Self {
        Range {
            min,
            min_exclusive: false,
            max,
            integer: true,
        }
    }

    /// Whether `x` lies in the range (never for NaN or an infinity).
    pub fn contains(&self, x: f64) -> bool {
        x.is_finite()
            && (x > self.min || (!self.min_exclusive && x == self.min))
            && x <= self.max
            && (!self.integer || x.fract() == 0.0)
    }

    fn describe(&self) -> String {
        format!(
            "{} in {}{}, {}]",
            if self.integer {
                "a whole number"
            } else {
                "a number"
            },
            if self.min_exclusive { "(" } else { "[" },
            self.min,
            self.max
        )
    }
}

/// The range of the entry `key` (dotted, `section.name`). Costs (`_us`,
/// `_ns`) are at most 1 s; rates (`_per_s`) at most 10^6/s; the rest are
/// named one by one. `None`: the key has no rule.
pub fn range_of(key: &str) -> Option<Range> {
    Some(match key {
        // Frequencies, divided by: > 0.
        "cpu.ghz" => Range::closed(0.01, 100.0),
        // A share of a core's speed alone: (0, 1].
        "cpu.smt_shared_speed" => Range::positive(1.0),
        "jetson.carmel_ghz" | "jetson.altra_ghz" | "jetson.rpi4_ghz" => Range::closed(0.01, 100.0),
        "apic.bus_mhz" => Range::closed(1.0, 10_000.0),
        "aia.timebase_mhz" => Range::closed(0.001, 10_000.0),
        "host.hz" => Range::closed(1.0, 10_000.0),
        "nic.link_gbps" | "jetson.link_gbps" => Range::closed(0.001, 1000.0),
        // 82599 EITR interval granularity: 2.048 µs at 10 GbE, and larger
        // at lower link speeds.
        "nic.itr_unit_us" => Range::closed(0.001, 100.0),
        "guest.whileloop_cycles_per_iter" => Range::positive(1e6),
        // A coefficient of variation: 0 (fixed costs) up to 1.
        "guest.cost_cv" => Range::closed(0.0, 1.0),
        // EITR register values: the 12-bit field as written (0x0FFF).
        "nic.itr_lowest_reg" | "nic.itr_low_reg" | "nic.itr_bulk_reg" => Range::count(0.0, 4095.0),
        "nic.itr_low_threshold_bytes_per_us" | "nic.itr_bulk_threshold_bytes_per_us" => {
            Range::count(0.0, 1e6)
        }
        // ixgbevf: 64..=4096 descriptors (IXGBEVF_MIN_RXD, _MAX_RXD).
        "nic.rx_ring_size" => Range::count(64.0, 4096.0),
        "nic.rx_refill_batch" => Range::count(1.0, 4096.0),
        "nic.napi_weight" => Range::count(1.0, crate::scenario::MAX_NAPI_WEIGHT as f64),
        "nic.netdev_budget" => Range::count(1.0, 1e6),
        // The tap queue is allocated up front; Linux's default
        // tx_queue_len is 1000.
        "vhost.tap_queue_frames" => Range::count(1.0, 65_536.0),
        k if k.ends_with("_us") => Range::closed(0.0, 1e6),
        k if k.ends_with("_ns") => Range::closed(0.0, 1e9),
        k if k.ends_with("_per_s") => Range::closed(0.0, 1e6),
        _ => return None,
    })
}

impl Calibration {
    /// Parses and checks a calibration file's text.
    pub fn from_toml(text: &str) -> Result<Self, CalibrationError> {
        let c: Calibration = toml::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    /// Checks every entry against its range ([`range_of`]); for a
    /// calibration built or edited in code rather than read from a file.
    pub fn check(&self) -> Result<(), CalibrationError> {
        let v =
            toml::Value::try_from(self).map_err(|e| CalibrationError::Internal(e.to_string()))?;
        check(&v, "")?;
        check_clock(&v, "")?;
        let (lat, max) = (
            self.host.ipi_latency_us.value,
            self.host.ipi_latency_max_us.value,
        );
        if max < lat {
            return Err(CalibrationError::Inconsistent(format!(
                "host.ipi_latency_max_us = {max} is below host.ipi_latency_us = {lat}: the delivery bound is the latest an IPI lands"
            )));
        }
        Ok(())
    }

    /// This calibration at its own `cpu.ghz`: every cycle-bound cost
    /// (`at_ghz`) scaled by at_ghz / cpu.ghz and retagged; wall-time
    /// costs unchanged. Idempotent.
    pub fn at_cpu_clock(&self) -> Calibration {
        let ghz = self.cpu.ghz.value;
        let mut v = toml::Value::try_from(self).expect("a calibration serialises");
        rescale(&mut v, ghz);
        let mut out: Calibration = v.try_into().expect("a rescaled calibration deserialises");
        // The ARM entries are not clock-tagged (the ARM host's file gives
        // costs at its own core): carried over as they are.
        out.arm = self.arm.clone();
        // So are the RISC-V file's (its costs are at its own harts' clock).
        out.riscv = self.riscv.clone();
        out
    }

    /// This calibration with the peer hosts' cycle-bound costs (`[peer]`)
    /// at a clock of their own, `ghz` (a board whose peer is another
    /// machine: the Jetson's Raspberry Pi 4); the rest unchanged.
    pub fn peer_at_clock(&self, ghz: f64) -> Calibration {
        let mut out = self.clone();
        if let Ok(mut v) = toml::Value::try_from(&self.peer) {
            rescale(&mut v, ghz);
            if let Ok(p) = v.try_into() {
                out.peer = p;
            }
        }
        out
    }

    /// The shipped calibration.
    pub fn default_host() -> Self {
        Self::from_toml(DEFAULT_TOML).expect("shipped calibration parses")
    }

    /// The entries whose value differs from `base`'s, by dotted key
    /// (`host.ipi_latency_max_us`), with this calibration's value and
    /// source: with the tool version that names `base`, what a report
    /// needs to say which costs produced it. Compare calibrations before
    /// [`Calibration::at_cpu_clock`]: scaled costs are derived, not chosen.
    pub fn changes_from(&self, base: &Calibration) -> std::collections::BTreeMap<String, Entry> {
        self.changes_against(&entry_values(base))
    }

    /// [`Calibration::changes_from`] the shipped calibration, whose values
    /// are read once per process.
    pub fn changes_from_shipped(&self) -> std::collections::BTreeMap<String, Entry> {
        static SHIPPED: std::sync::OnceLock<std::collections::BTreeMap<String, u64>> =
            std::sync::OnceLock::new();
        let mut out = self
            .changes_against(SHIPPED.get_or_init(|| entry_values(&Calibration::default_host())));
        // The ARM entries an overlay changed, by the same dotted keys.
        static SHIPPED_ARM: std::sync::OnceLock<std::collections::BTreeMap<String, u64>> =
            std::sync::OnceLock::new();
        let shipped = SHIPPED_ARM.get_or_init(|| entry_values(&ArmCalibration::default_arm()));
        if let Ok(v) = toml::Value::try_from(&self.arm) {
            let _ = for_each_entry(&v, "", &mut |path, t| -> Result<(), ()> {
                if let Ok(e) = toml::Value::Table(t.clone()).try_into::<Entry>() {
                    if shipped.get(path) != Some(&e.value.to_bits()) {
                        out.insert(path.to_string(), e);
                    }
                }
                Ok(())
            });
        }
        // And the RISC-V file's.
        static SHIPPED_RISCV: std::sync::OnceLock<std::collections::BTreeMap<String, u64>> =
            std::sync::OnceLock::new();
        let shipped =
            SHIPPED_RISCV.get_or_init(|| entry_values(&RiscvCalibration::default_riscv()));
        if let Ok(v) = toml::Value::try_from(&self.riscv) {
            let _ = for_each_entry(&v, "", &mut |path, t| -> Result<(), ()> {
                if let Ok(e) = toml::Value::Table(t.clone()).try_into::<Entry>() {
                    if shipped.get(path) != Some(&e.value.to_bits()) {
                        out.insert(path.to_string(), e);
                    }
                }
                Ok(())
            });
        }
        out
    }

    fn changes_against(
        &self,
        base: &std::collections::BTreeMap<String, u64>,
    ) -> std::collections::BTreeMap<String, Entry> {
        let mut out = std::collections::BTreeMap::new();
        let Ok(v) = toml::Value::try_from(self) else {
            return out;
        };
        let _ = for_each_entry(&v, "", &mut |path, t| -> Result<(), ()> {
            let e = toml::Value::Table(t.clone()).try_into::<Entry>();
            if let Ok(e) = e {
                if base.get(path) != Some(&e.value.to_bits()) {
                    out.insert(path.to_string(), e);
                }
            }
            Ok(())
        });
        out
    }
}

/// Every entry's value of `c` (bit patterns), by dotted key.
fn entry_values<T: Serialize>(c: &T) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    if let Ok(v) = toml::Value::try_from(c) {
        let _ = for_each_entry(&v, "", &mut |path, t| -> Result<(), ()> {
            if let Some(x) = entry_number(t) {
                out.insert(path.to_string(), x.to_bits());
            }
            Ok(())
        });
    }
    out
}

/// An entry's `value` as a number (an integer in a file counts).
fn entry_number(t: &toml::Table) -> Option<f64> {
    let x = t.get("value")?;
    x.as_float().or(x.as_integer().map(|i| i as f64))
}

/// Calls `f` with the dotted path of every entry under `v` (a table with
/// `value` and `source`), depth first, stopping at the first error.
fn for_each_entry<E>(
    v: &toml::Value,
    path: &str,
    f: &mut impl FnMut(&str, &toml::Table) -> Result<(), E>,
) -> Result<(), E> {
    let Some(t) = v.as_table() else {
        return Ok(());
    };
    if t.contains_key("value") && t.contains_key("source") {
        return f(path, t);
    }
    for (k, c) in t {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        for_each_entry(c, &p, f)?;
    }
    Ok(())
}

/// Every cost entry (`_us`, `_ns`) of `v` says the clock it holds at or
/// that it is wall-time bound.
fn check_clock(v: &toml::Value, path: &str) -> Result<(), CalibrationError> {
    for_each_entry(v, path, &mut |path, t| {
        let cost = path.ends_with("_us") || path.ends_with("_ns");
        let at = t.get("at_ghz").and_then(|x| x.as_float());
        let wall = t.get("wall").and_then(|x| x.as_bool()).unwrap_or(false);
        if let Some(g) = at {
            if !(g > 0.0 && g <= 100.0) {
                return Err(CalibrationError::OutOfRange {
                    key: format!("{path}.at_ghz"),
                    value: g,
                    range: "in (0, 100]".into(),
                });
            }
        }
        if cost && (at.is_some() == wall) || !cost && (at.is_some() || wall) {
            return Err(CalibrationError::Clock(path.to_string()));
        }
        Ok(())
    })
}

/// Scales every `at_ghz` entry under `v` to `ghz`.
fn rescale(v: &mut toml::Value, ghz: f64) {
    let Some(t) = v.as_table_mut() else {
        return;
    };
    if let Some(at) = t.get("at_ghz").and_then(|x| x.as_float()) {
        if at == ghz {
            // Already at this clock: the value stays bit for bit.
            return;
        }
        if let Some(x) = t
            .get("value")
            .and_then(|x| x.as_float().or(x.as_integer().map(|i| i as f64)))
        {
            t.insert("value".into(), toml::Value::Float(x * at / ghz));
            t.insert("at_ghz".into(), toml::Value::Float(ghz));
        }
        return;
    }
    for (_, c) in t.iter_mut() {
        rescale(c, ghz);
    }
}

/// Parses a calibration file's text and checks every entry against its
/// range ([`range_of`]): the ARM and RISC-V files' reader.
fn parse_checked<T>(text: &str) -> Result<T, CalibrationError>
where
    T: serde::de::DeserializeOwned + Serialize,
{
    let c: T = toml::from_str(text)?;
    let v = toml::Value::try_from(&c).map_err(|e| CalibrationError::Internal(e.to_string()))?;
    check(&v, "")?;
    Ok(c)
}

fn check(v: &toml::Value, path: &str) -> Result<(), CalibrationError> {
    for_each_entry(v, path, &mut |path, t| {
        let x = entry_number(t).unwrap_or(f64::NAN);
        let r = range_of(path).ok_or_else(|| CalibrationError::NoRange(path.to_string()))?;
        if !r.contains(x) {
            return Err(CalibrationError::OutOfRange {
                key: path.to_string(),
                value: x,
                range: r.describe(),
            });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Sapphire Rapids preset layers over the x86 file: every entry
    /// tagged, the clock and the round trip as it says.
    #[test]
    fn the_sapphire_rapids_overlay_applies() {
        let base = Calibration::default_host();
        let o = crate::calibration_overlay::parse_overlay(SPR_OVERLAY_TOML, "x86-spr-host.toml")
            .expect("parses");
        assert!(o.len() >= 5);
        assert!(o
            .iter()
            .all(|e| e.source.starts_with("[public]") || e.source.starts_with("[estimate]")));
        let c = crate::calibration_overlay::apply_to(&base, &o).expect("applies");
        assert_eq!(c.cpu.ghz.value, 2.0);
        assert_eq!(c.vmx.exit_entry_roundtrip_us.value, 0.55);
    }

    /// The Zen 4 preset layers over the x86 file: every entry tagged, the
    /// clock as it says, the SVM round trip's cycles kept from the base.
    #[test]
    fn the_zen4_overlay_applies() {
        let base = Calibration::default_host();
        let o = crate::calibration_overlay::parse_overlay(ZEN4_OVERLAY_TOML, "x86-zen4-host.toml")
            .expect("parses");
        assert!(o.len() >= 3);
        assert!(o
            .iter()
            .all(|e| e.source.starts_with("[public]") || e.source.starts_with("[estimate]")));
        let c = crate::calibration_overlay::apply_to(&base, &o).expect("applies");
        assert_eq!(c.cpu.ghz.value, 2.4);
        assert_eq!(
            c.svm.vmrun_vmexit_roundtrip_us.value,
            base.svm.vmrun_vmexit_roundtrip_us.value
        );
    }

    #[test]
    fn shipped_arm_file_parses_with_tagged_sources_and_rejects_out_of_range() {
        let c = ArmCalibration::default_arm();
        assert_eq!(c.el2.world_switch_ns.value, 153.0);
        for line in ARM_DEFAULT_TOML
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && l.contains("source"))
        {
            assert!(
                ["[paper]", "[public]", "[estimate]"]
                    .iter()
                    .any(|t| line.contains(t)),
                "untagged source: {line}"
            );
        }
        let bad = ARM_DEFAULT_TOML.replace("value = 153.0", "value = -1.0");
        assert!(matches!(
            ArmCalibration::from_toml(&bad),
            Err(CalibrationError::OutOfRange { ref key, .. }) if key == "el2.world_switch_ns"
        ));
    }

    #[test]
    fn shipped_riscv_file_parses_with_tagged_sources_and_an_overlay_reaches_it() {
        let c = RiscvCalibration::default_riscv();
        assert_eq!(c.hs.world_switch_ns.value, 150.0);
        for line in RISCV_DEFAULT_TOML
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && l.contains("source"))
        {
            assert!(
                ["[paper]", "[public]", "[estimate]"]
                    .iter()
                    .any(|t| line.contains(t)),
                "untagged source: {line}"
            );
        }
        let bad = RISCV_DEFAULT_TOML.replace("value = 150.0", "value = -1.0");
        assert!(matches!(
            RiscvCalibration::from_toml(&bad),
            Err(CalibrationError::OutOfRange { ref key, .. }) if key == "hs.world_switch_ns"
        ));
        // A dotted key reaches the RISC-V file; the ARM file is untouched
        // and the change is reported as provenance.
        let o = crate::calibration_overlay::layered(None, &["hs.world_switch_ns=300".into()])
            .expect("applies");
        assert_eq!(o.riscv.hs.world_switch_ns.value, 300.0);
        assert_eq!(o.arm.el2.world_switch_ns.value, 153.0);
        assert!(o.changes_from_shipped().contains_key("hs.world_switch_ns"));
    }

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

    /// Every cost says its clock: a cycle-bound one scales with cpu.ghz,
    /// a wall-time one does not; at the clock it was measured at nothing
    /// changes, bit for bit.
    #[test]
    fn cycle_bound_costs_scale_with_the_core_clock_wall_time_ones_do_not() {
        let c = Calibration::default_host();
        assert_eq!(c.exit.external_interrupt_us.at_ghz, Some(3.4));
        assert!(c.nic.tx_fetch_us.wall && c.nic.tx_fetch_us.at_ghz.is_none());
        let same = c.at_cpu_clock();
        assert_eq!(
            same.exit.external_interrupt_us.value.to_bits(),
            c.exit.external_interrupt_us.value.to_bits()
        );
        let mut slow = c.clone();
        slow.cpu.ghz.value = 1.7;
        let s = slow.at_cpu_clock();
        assert!((s.exit.external_interrupt_us.value - 2.0 * 1.97).abs() < 1e-12);
        assert!((s.guest.rx_per_packet_ns.value - 1800.0).abs() < 1e-9);
        assert_eq!(s.exit.external_interrupt_us.at_ghz, Some(1.7));
        assert_eq!(s.nic.tx_fetch_us.value, c.nic.tx_fetch_us.value);
        assert_eq!(s.host.ipi_latency_us.value, c.host.ipi_latency_us.value);
        // Idempotent.
        let again = s.at_cpu_clock();
        assert_eq!(
            again.guest.rx_per_packet_ns.value.to_bits(),
            s.guest.rx_per_packet_ns.value.to_bits()
        );
        // A cost without a tag, or with both, is refused.
        let untagged = DEFAULT_TOML.replace(
            "external_interrupt_us = { value = 1.97, source",
            "external_interrupt_us = { value = 1.97, wall = true, source",
        );
        assert!(matches!(
            Calibration::from_toml(&untagged),
            Err(CalibrationError::Clock(ref k)) if k == "exit.external_interrupt_us"
        ));
    }

    /// The shipped calibration with `key` (dotted) set to `value`.
    fn with(key: &str, value: toml::Value) -> String {
        let mut t: toml::Table = toml::from_str(DEFAULT_TOML).unwrap();
        let (sec, k) = key.split_once('.').unwrap();
        t[sec][k]["value"] = value;
        toml::to_string(&t).unwrap()
    }

    #[test]
    fn every_entry_has_a_range_that_holds_its_shipped_value() {
        let v = toml::Value::try_from(Calibration::default_host()).unwrap();
        let mut n = 0;
        for (sec, entries) in v.as_table().unwrap() {
            for (k, e) in entries.as_table().unwrap() {
                let key = format!("{sec}.{k}");
                let r = range_of(&key).unwrap_or_else(|| panic!("{key} has no range"));
                let x = e["value"].as_float().unwrap();
                assert!(r.contains(x), "{key} = {x} outside {r:?}");
                n += 1;
            }
        }
        assert!(n > 40);
    }

    #[test]
    fn zero_absurd_and_non_finite_values_name_the_key() {
        use toml::Value::{Float, Integer};
        for (key, value) in [
            ("nic.link_gbps", Integer(0)),
            ("cpu.ghz", Float(0.0)),
            ("apic.bus_mhz", Integer(0)),
            ("nic.napi_weight", Integer(0)),
            ("vhost.tap_queue_frames", Float(1e9)),
            ("nic.rx_ring_size", Float(512.5)),
            ("nic.rx_ring_size", Integer(1_000_000)),
            ("nic.itr_low_reg", Integer(0x1000)),
            ("host.hz", Float(f64::INFINITY)),
            ("guest.rx_per_packet_ns", Float(f64::NAN)),
            ("exit.nmi_us", Float(1e300)),
            ("background.io_instruction_per_s", Float(-1.0)),
            ("guest.whileloop_cycles_per_iter", Integer(0)),
        ] {
            let e = Calibration::from_toml(&with(key, value.clone()))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains("out of range"),
                "{key} = {value}: {e}"
            );
        }
        // Zero is a legal cost or rate: the primitive is free.
        assert!(Calibration::from_toml(&with("guest.rx_per_packet_ns", Integer(0))).is_ok());
        assert!(
            Calibration::from_toml(&with("background.io_instruction_per_s", Integer(0))).is_ok()
        );
    }

    #[test]
    fn negative_values_and_unknown_keys_are_rejected() {
        let bad = DEFAULT_TOML.replacen("value = 1.97", "value = -1.97", 1);
        let e = Calibration::from_toml(&bad).unwrap_err().to_string();
        assert!(e.contains("exit.external_interrupt_us"), "{e}");
        let unknown = format!("{DEFAULT_TOML}\n[extra]\nx = {{ value = 1, source = \"s\" }}\n");
        assert!(Calibration::from_toml(&unknown).is_err());
    }

    #[test]
    fn changes_from_names_only_the_entries_that_differ() {
        let base = Calibration::default_host();
        assert!(base.changes_from(&base).is_empty());
        let mut c = base.clone();
        c.host.ipi_latency_max_us = Entry {
            value: 3.5,
            source: "--calibration-set".into(),
            ..base.host.ipi_latency_max_us.clone()
        };
        let ch = c.changes_from(&base);
        assert_eq!(ch.len(), 1, "{ch:?}");
        let e = &ch["host.ipi_latency_max_us"];
        assert_eq!((e.value, e.source.as_str()), (3.5, "--calibration-set"));
    }
}
