//! kvm-tools' userspace virtio-net back end (`net.backend = "kvmtool-tap"`,
//! `hv::kvmtool_net`) in the world: frames cross it whole and in order,
//! its three threads sleep and wake where kvmtool's do (the ioeventfd
//! thread in `epoll_wait`, TX and RX in `pthread_cond_wait`, RX in a tap
//! `readv`), and its exits differ from vhost-net's only as its threads
//! make them.

use crate::common::{metric, rate, run_text};

/// netperf TCP_STREAM from the VM (1 vCPU on core 1) to the load
/// generator over the bridge and the link, the back end's threads on
/// core 7.
const STREAM: &str = r#"
scheme = "kvm"
seed = 3
duration_s = 0.04
warmup_s = 0.01
[machine]
cores = 8
[net]
device = "virtio"
peer = "remote"
backend = "kvmtool-tap"
[host]
io_cores = [7]
[workload.netperf]
test = "tcp-stream"
direction = "send"
msg_bytes = 16384
"#;

/// netperf UDP_RR with the VM as the client, one transaction at a time.
const RR: &str = r#"
scheme = "kvm"
seed = 3
duration_s = 0.04
warmup_s = 0.01
[machine]
cores = 8
[net]
device = "virtio"
peer = "remote"
backend = "kvmtool-tap"
[host]
io_cores = [7]
[workload.netperf]
test = "udp-rr"
direction = "send"
msg_bytes = 1
"#;

const NO_OFFLOAD: [&str; 3] = ["guest.gso=false", "guest.gro=false", "net.peer_gso=false"];

/// Every segment the guest's TCP sends reaches the receiver through the
/// TX thread's writes and every ACK comes back through the RX thread's
/// reads: no retransmission (a lost or reordered segment would cause
/// one), no tap drop, and each frame the TX thread took left it.
#[test]
fn the_stream_crosses_the_tap_whole_and_in_order() {
    for offload in [true, false] {
        let sets: &[&str] = if offload { &[] } else { &NO_OFFLOAD };
        let r = run_text(STREAM, sets);
        let what = if offload { "TSO" } else { "no offload" };
        assert_eq!(r.violations(), 0, "{what}");
        let gbps = metric(&r, "netperf.throughput_gbps");
        assert!(gbps > 1.0, "{what}: the stream flows ({gbps} Gb/s)");
        assert_eq!(metric(&r, "guest.tcp_retransmits"), 0.0, "{what}");
        assert_eq!(metric(&r, "kvmtool.tap_drops"), 0.0, "{what}");
        let tx = metric(&r, "kvmtool.tx_frames");
        let rx = metric(&r, "kvmtool.rx_frames");
        assert!(tx > 100.0 && rx > 10.0, "{what}: {tx} sent, {rx} ACKs read");
        // Every kick is an I/O-instruction exit, and each reaches the
        // ioeventfd thread as one ready eventfd (or merges with one not
        // yet read).
        let kicks = metric(&r, "kvmtool.kicks");
        let io_exits = rate(&r, "IO_INSTRUCTION") * 0.04;
        assert!(
            (kicks - io_exits).abs() <= 2.0,
            "{kicks} kicks, {io_exits} exits"
        );
        let events = metric(&r, "kvmtool.ioeventfd_events");
        assert!(events <= kicks + 1.0 && events >= 1.0, "{events} events");
    }
}

/// UDP_RR: per transaction the guest kicks TX once, the ioeventfd thread
/// wakes out of epoll_wait and wakes the TX thread out of its condition
/// wait, and the RX thread, blocked in readv on the empty tap, is woken by
/// the reply and blocks again.
#[test]
fn the_threads_block_and_wake_where_kvmtools_do() {
    let r = run_text(RR, &[]);
    assert_eq!(r.violations(), 0);
    let dur = 0.04;
    let n = metric(&r, "udp_rr.transactions");
    assert!(n > 100.0, "{n} transactions");
    let per = |k: &str| metric(&r, k) / n;
    let near_one = |k: &str, x: f64| assert!((x - 1.0).abs() < 0.02, "{k}: {x} per transaction");
    near_one("kicks", per("kvmtool.kicks"));
    near_one(
        "epoll wake-ups",
        metric(&r, "kvmtool.ioeventfd_thread_wakeups_per_s") * dur / n,
    );
    near_one(
        "TX wake-ups",
        metric(&r, "kvmtool.tx_thread_wakeups_per_s") * dur / n,
    );
    near_one(
        "RX wake-ups",
        metric(&r, "kvmtool.rx_thread_wakeups_per_s") * dur / n,
    );
    near_one("readv blocks", per("kvmtool.rx_read_blocks"));
    near_one("RX signals", per("kvmtool.rx_signals"));
    // At one frame at a time no condition signal finds its thread busy.
    assert_eq!(metric(&r, "kvmtool.lost_cond_signals"), 0.0);
    // The extra hop (ioeventfd thread, then TX thread) costs latency
    // against vhost's one worker woken by the eventfd.
    let vhost = run_text(RR, &["net.backend=vhost"]);
    let (k, v) = (
        metric(&r, "udp_rr.latency_us"),
        metric(&vhost, "udp_rr.latency_us"),
    );
    assert!(k > v, "kvmtool {k} us, vhost {v} us");
}

/// The exits are the scheme's under either back end (kicks, the
/// interrupt's injection, EOIs), but how many there are per frame follows
/// the threads. Without offloads, with the threads on core 7 and the TX
/// side saturated, kvmtool's RX thread is a thread of its own that reads
/// each ACK as it comes and signals after it when `used_event` asks,
/// where vhost's one worker reads ACKs between TX turns, in batches that
/// `used_event` signals once: more external-interrupt exits (and their
/// EOI exits) per ACK under kvmtool. Its TX thread signals at most once
/// per drained batch, and a batch begins only with a wake-up.
#[test]
fn exits_per_frame_follow_the_threads() {
    let mut sets = NO_OFFLOAD.to_vec();
    let k = run_text(STREAM, &sets);
    sets.push("net.backend=vhost");
    let v = run_text(STREAM, &sets);
    assert_eq!(k.violations() + v.violations(), 0);
    let busy = metric(&k, "kvmtool.tx_thread_busy_pct");
    assert!(busy > 90.0, "kvmtool's TX thread is the bound: {busy}%");
    let irqs_per_ack = |r, acks: &str| rate(r, "EXTERNAL_INTERRUPT") / metric(r, acks);
    let (ki, vi) = (
        irqs_per_ack(&k, "kvmtool.rx_frames"),
        irqs_per_ack(&v, "vhost.rx_frames"),
    );
    assert!(ki > vi, "interrupts per ACK: kvmtool {ki}, vhost {vi}");
    let eoi_per_irq = rate(&k, "MSR_WRITE") / rate(&k, "EXTERNAL_INTERRUPT");
    assert!(
        eoi_per_irq >= 0.95,
        "each injected interrupt's EOI exits: {eoi_per_irq}"
    );
    let batches = metric(&k, "kvmtool.tx_thread_wakeups_per_s") * 0.04;
    let tx_signals = metric(&k, "kvmtool.tx_signals");
    assert!(
        tx_signals <= batches + 1.0,
        "{tx_signals} TX signals for {batches} batches"
    );
    for r in [&k, &v] {
        for reason in r.vms[0].exits_per_s_by_reason.keys() {
            assert!(
                [
                    "IO_INSTRUCTION",
                    "EXTERNAL_INTERRUPT",
                    "MSR_WRITE",
                    "PENDING_INTERRUPT",
                    "EPT_VIOLATION",
                    "HLT"
                ]
                .contains(reason),
                "unexpected exit reason {reason}"
            );
        }
    }
}

/// Same scenario, same seed: the same report.
#[test]
fn the_kvmtool_path_is_deterministic() {
    let a = run_text(STREAM, &NO_OFFLOAD);
    let b = run_text(STREAM, &NO_OFFLOAD);
    assert_eq!(format!("{:?}", a.metrics), format!("{:?}", b.metrics));
    assert_eq!(
        format!("{:?}", a.vms[0].exits_per_s_by_reason),
        format!("{:?}", b.vms[0].exits_per_s_by_reason)
    );
}

/// Bad input names its key: an unknown back end, and kvmtool under a
/// scheme that polls vhost's rings (ELVIS).
#[test]
fn bad_backends_are_refused_by_key() {
    let s = exitless::scenario::Scenario::parse(STREAM, &["net.backend=qemu".to_string()]);
    let e = s.expect_err("unknown back end refused").to_string();
    assert!(e.contains("backend"), "{e}");
    let s = exitless::scenario::Scenario::parse(
        STREAM,
        &[
            "net.backend=vhost".to_string(),
            "net.kvmtool_affinity=false".to_string(),
        ],
    );
    let e = s.expect_err("placement of threads vhost lacks").to_string();
    assert!(e.contains("kvmtool_affinity"), "{e}");
    let s =
        exitless::scenario::Scenario::parse(STREAM, &["scheme=elvis".to_string()]).expect("parses");
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .expect("ELVIS needs vhost's worker")
        .to_string();
    assert!(e.contains("net.backend"), "{e}");
}

/// Without affinity (`net.kvmtool_affinity = false`) the threads start on
/// the vCPU's core but CFS wakes them onto idle cores: the guest keeps its
/// core (time in guest as with the threads on a core of their own) and
/// the threads migrate.
#[test]
fn free_threads_leave_the_vcpus_core() {
    let mut sets = NO_OFFLOAD.to_vec();
    sets.push("host.io_cores=[1]");
    let pinned = run_text(STREAM, &sets);
    sets.push("net.kvmtool_affinity=false");
    let free = run_text(STREAM, &sets);
    assert_eq!(pinned.violations() + free.violations(), 0);
    let tig = |r: &exitless::report::RunReport| r.vms[0].tig_pct;
    assert!(
        tig(&free) > tig(&pinned) + 20.0,
        "time in guest: pinned {}, free {}",
        tig(&pinned),
        tig(&free)
    );
    let (p, f) = (
        metric(&pinned, "netperf.throughput_gbps"),
        metric(&free, "netperf.throughput_gbps"),
    );
    assert!(f > p, "pinned {p} Gb/s, free {f} Gb/s");
}

/// The VM host's own stack under the bridge (issue 41): every frame the
/// TX thread wrote crossed the bridge and the host NIC's xmit inside its
/// writev, every ACK the RX thread read came up through the host NIC's
/// interrupt, NAPI and the bridge, and that receive path runs on the core
/// the NIC's interrupt goes to: on the vCPU's core it costs the vCPU
/// external-interrupt exits, on an idle core none.
#[test]
fn the_bridged_hosts_stack_runs_on_the_interrupts_core() {
    let dur = 0.04;
    let mut sets = NO_OFFLOAD.to_vec();
    let k = run_text(STREAM, &sets);
    assert_eq!(k.violations(), 0);
    let tx = metric(&k, "kvmtool.tx_frames");
    let host_tx = metric(&k, "kvmtool.host_tx_frames_per_s") * dur;
    assert!(
        (tx - host_tx).abs() <= 1.0,
        "{tx} written, {host_tx} through the bridge and xmit"
    );
    let rx = metric(&k, "kvmtool.rx_frames");
    let host_rx = metric(&k, "kvmtool.host_rx_frames_per_s") * dur;
    assert!(
        rx > 10.0 && (rx - host_rx).abs() <= 4.0,
        "{rx} read, {host_rx} up the host's receive path"
    );
    assert!(metric(&k, "kvmtool.host_nic_irqs_per_s") > 0.0);
    assert!(metric(&k, "kvmtool.host_rx_busy_pct") > 0.0);
    // The bridge and xmit are part of the TX thread's time.
    assert!(metric(&k, "kvmtool.tx_thread_busy_pct") > metric(&k, "kvmtool.host_tx_busy_pct"));
    // The threads on core 7, the NIC's interrupt on the vCPU's core 1
    // (where the guest runs almost all the time), then on idle core 0.
    sets.push("net.host_nic_irq_core=1");
    let on_vcpu = run_text(STREAM, &sets);
    sets.pop();
    sets.push("net.host_nic_irq_core=0");
    let on_idle = run_text(STREAM, &sets);
    assert_eq!(on_vcpu.violations() + on_idle.violations(), 0);
    let ext = |r| rate(r, "EXTERNAL_INTERRUPT");
    let irqs = metric(&on_vcpu, "kvmtool.host_nic_irqs_per_s");
    assert!(
        ext(&on_vcpu) > ext(&on_idle) + 0.5 * irqs,
        "external-interrupt exits: {} with the NIC's interrupt on the vCPU's core, {} on core 0 ({irqs} NIC interrupts/s)",
        ext(&on_vcpu),
        ext(&on_idle)
    );
}
