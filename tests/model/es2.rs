//! ES2's workloads end to end (scenarios/es2): netperf TCP and UDP
//! streams both ways, memaslap, nginx and Apache under ApacheBench, ping;
//! each over virtio-net and over the VF, and over the VFs of other VMs.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::report::RunReport;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::path::PathBuf;

/// Runs `scenarios/es2/<name>` with overrides.
fn es2(name: &str, sets: &[&str]) -> RunReport {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/es2")
        .join(name);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::load(&path, &sets).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
    w.run(|_| {});
    w.report()
}

const DEVICES: [&str; 2] = ["virtio", "vf"];

/// The link's payload rate bound: 10 GbE, no more than payload/frame of it.
const LINK_GBPS: f64 = 10.0;

fn ordered(r: &RunReport, stem: &str, what: &str) {
    let p: Vec<f64> = ["p50", "p90", "p99", "p999"]
        .iter()
        .map(|q| metric(r, &format!("{stem}_{q}_us")))
        .collect();
    assert!(p[0] > 0.0, "{what}: {p:?}");
    assert!(p.windows(2).all(|w| w[0] <= w[1]), "{what}: {p:?}");
}

#[test]
fn netperf_tcp_streams_flow_both_ways_below_their_bound() {
    for dir in ["send", "recv"] {
        for dev in DEVICES {
            let what = format!("{dir}/{dev}");
            let r = es2(
                &format!("netperf-tcp-{dir}.toml"),
                &[&format!("net.device={dev}")],
            );
            assert_eq!(r.violations(), 0, "{what}");
            let gbps = metric(&r, "netperf.throughput_gbps");
            // Over the VF the link bounds it; the virtio peer is a process
            // on the host (no link), whose GSO packets cross the bridge
            // whole: only the CPUs bound it.
            let bound = if dev == "vf" { LINK_GBPS } else { 100.0 };
            assert!(gbps > 0.5 && gbps < bound, "{what}: {gbps}");
            // The sender's 512-byte send() calls carry at least what the
            // receiver got in the window (the socket buffers hold the
            // rest: at most a few MiB).
            let sent = metric(&r, "netperf.messages_sent") * 512.0;
            let got = metric(&r, "netperf.bytes");
            assert!(sent > 0.5 * got && sent < got + 4e6, "{what}: {sent} {got}");
        }
    }
}

#[test]
fn netperf_instances_each_carry_a_share_and_the_total_is_their_sum() {
    let r = es2(
        "netperf-tcp-send.toml",
        &["net.device=vf", "workload.netperf.threads=2"],
    );
    let t0 = metric(&r, "netperf.thread0.throughput_gbps");
    let t1 = metric(&r, "netperf.thread1.throughput_gbps");
    let all = metric(&r, "netperf.throughput_gbps");
    assert!(t0 > 0.1 && t1 > 0.1, "{t0} {t1}");
    assert!((t0 + t1 - all).abs() < 1e-9, "{t0} + {t1} != {all}");
    assert!(all < LINK_GBPS);
}

#[test]
fn netperf_udp_send_delivers_what_the_guest_sent() {
    for dev in DEVICES {
        for scheme in ["kvm", "apicv"] {
            let what = format!("{scheme}/{dev}");
            let r = es2(
                "netperf-udp-send.toml",
                &[&format!("net.device={dev}"), &format!("scheme={scheme}")],
            );
            assert_eq!(r.violations(), 0, "{what}");
            let sent = metric(&r, "netperf.messages_sent");
            let got = metric(&r, "netperf.messages_received");
            // Nothing is lost on the way to the client host: the guest
            // blocks on its send buffer instead. The counts differ only by
            // what is in flight at either edge of the window, at most what
            // the queues on the way hold (virtqueue 256 and tap queue 500,
            // or the VF's TX ring 512).
            assert!(sent > 10_000.0, "{what}: {sent}");
            assert!((sent - got).abs() <= 756.0, "{what}: {sent} {got}");
            assert_eq!(metric(&r, "guest.socket_drops"), 0.0, "{what}");
            if dev == "virtio" {
                assert_eq!(metric(&r, "vhost.tap_drops"), 0.0, "{what}");
            }
            let gbps = metric(&r, "netperf.throughput_gbps");
            // 512 of every 554+24 bytes on the wire.
            assert!(
                gbps > 0.5 && gbps < LINK_GBPS * 512.0 / 578.0,
                "{what}: {gbps}"
            );
        }
    }
}

#[test]
fn netperf_udp_recv_counts_only_what_the_application_got() {
    for dev in DEVICES {
        let r = es2("netperf-udp-recv.toml", &[&format!("net.device={dev}")]);
        assert_eq!(r.violations(), 0, "{dev}");
        let sent = metric(&r, "netperf.messages_sent");
        let got = metric(&r, "netperf.messages_received");
        assert!(got > 100.0, "{dev}: {got}");
        // The client sends faster than the 1-vCPU guest takes them: the
        // rest are dropped on the way (ring, tap queue, socket).
        assert!(got < sent, "{dev}: {got} of {sent}");
        let gbps = metric(&r, "netperf.throughput_gbps");
        assert!(
            (gbps - got * 512.0 * 8.0 / 0.05 / 1e9).abs() < 0.2 * gbps,
            "{dev}: {gbps}"
        );
    }
}

#[test]
fn memaslap_keeps_its_concurrency_in_flight_with_a_nine_to_one_mix() {
    for dev in DEVICES {
        // 100 ms: a tail of ~13 ms (requests behind a retransmission) needs
        // a window several times longer for Little's law to settle.
        let r = es2(
            "memaslap.toml",
            &[&format!("net.device={dev}"), "duration_s=0.1"],
        );
        assert_eq!(r.violations(), 0, "{dev}");
        let tps = metric(&r, "memcached.tps");
        let done = metric(&r, "memcached.completed");
        assert!(tps > 10_000.0, "{dev}: {tps}");
        // tps is completions over the 100 ms measured.
        assert!((done / 0.1 - tps).abs() < 0.05 * tps, "{dev}: {done} {tps}");
        let gets = metric(&r, "memcached.get_pct");
        assert!((87.0..93.0).contains(&gets), "{dev}: {gets}");
        // Little's law: 256 in flight = throughput × mean latency.
        let mean_s = metric(&r, "memcached.mean_ms") * 1e-3;
        let n = tps * mean_s;
        assert!((n - 256.0).abs() < 0.1 * 256.0, "{dev}: {n}");
        assert_eq!(metric(&r, "memcached.outstanding"), 256.0, "{dev}");
        let p: Vec<f64> = ["p50", "p90", "p99", "p999"]
            .iter()
            .map(|q| metric(&r, &format!("memcached.{q}_ms")))
            .collect();
        assert!(p[0] > 0.0 && p.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
    }
}

#[test]
fn nginx_serves_every_ab_connection_closed_loop() {
    for dev in DEVICES {
        for scheme in ["kvm", "apicv"] {
            let what = format!("{scheme}/{dev}");
            let r = es2(
                "nginx.toml",
                &[&format!("net.device={dev}"), &format!("scheme={scheme}")],
            );
            assert_eq!(r.violations(), 0, "{what}");
            let rps = metric(&r, "nginx.rps");
            assert!(rps > 5_000.0, "{what}: {rps}");
            ordered(&r, "nginx.latency", &what);
            // One port per worker, one ab process each: all four serve.
            let served: Vec<f64> = (0..4)
                .map(|j| metric(&r, &format!("nginx.served.worker{j}")))
                .collect();
            assert!(
                served.iter().all(|&s| s > 0.1 * rps * 0.05),
                "{what}: {served:?}"
            );
            // Little's law with 4 requests in flight (ab's own time
            // between a response and the next request is small).
            let n = rps * metric(&r, "nginx.latency_mean_us") * 1e-6;
            assert!(n > 3.0 && n <= 4.05, "{what}: {n}");
        }
    }
}

/// ab's default (no -k): every request is a connection of its own. The
/// guest sends at least the SYN-ACK, the response (its FIN on it) and the
/// ACK of ab's FIN per request, where a kept-alive connection sends the
/// response alone or with one ACK; the handshake's round trip and the
/// accept and close work cost requests per second.
#[test]
fn nginx_without_keep_alive_opens_a_connection_per_request() {
    let per_request = |r: &RunReport| metric(r, "guest.tx_frames") / metric(r, "nginx.completed");
    let new = es2("nginx.toml", &[]);
    let kept = es2("nginx.toml", &["workload.nginx.keep_alive=true"]);
    assert_eq!(new.violations(), 0);
    assert_eq!(kept.violations(), 0);
    assert!(per_request(&new) >= 2.9, "{}", per_request(&new));
    assert!(per_request(&kept) <= 2.1, "{}", per_request(&kept));
    assert!(
        metric(&new, "nginx.rps") < metric(&kept, "nginx.rps"),
        "{} vs {}",
        metric(&new, "nginx.rps"),
        metric(&kept, "nginx.rps")
    );
    // Every request served was accepted first: served = completed, give
    // or take the four in flight.
    let served: f64 = (0..4)
        .map(|j| metric(&new, &format!("nginx.served.worker{j}")))
        .sum();
    assert!((served - metric(&new, "nginx.completed")).abs() <= 4.0);
}

#[test]
fn apache_served_time_with_sixteen_connections() {
    for dev in DEVICES {
        let r = es2("apache.toml", &[&format!("net.device={dev}")]);
        assert_eq!(r.violations(), 0, "{dev}");
        ordered(&r, "apache.served", dev);
        let rps = metric(&r, "apache.rps");
        let n = rps * metric(&r, "apache.served_mean_us") * 1e-6;
        assert!(n > 12.0 && n <= 16.2, "{dev}: {n}");
        // The threads served what ab completed (window edges aside).
        let served = metric(&r, "apache.served");
        let done = metric(&r, "apache.completed");
        assert!((served - done).abs() <= 16.0, "{dev}: {served} {done}");
    }
    // More concurrency: more requests wait behind one another.
    let a = es2("apache.toml", &["workload.apache.concurrency=2"]);
    let b = es2("apache.toml", &["workload.apache.concurrency=32"]);
    assert!(
        metric(&b, "apache.served_p50_us") > metric(&a, "apache.served_p50_us"),
        "queueing"
    );
}

#[test]
fn ping_is_answered_by_the_guest_kernel_every_time() {
    for dev in DEVICES {
        let mut rtt = vec![];
        for scheme in ["kvm", "apicv", "did"] {
            let what = format!("{scheme}/{dev}");
            let r = es2(
                "ping.toml",
                &[
                    &format!("net.device={dev}"),
                    &format!("scheme={scheme}"),
                    "duration_s=0.2",
                    "workload.ping.interval_s=0.002",
                ],
            );
            assert_eq!(r.violations(), 0, "{what}");
            let sent = metric(&r, "ping.sent");
            let got = metric(&r, "ping.received");
            assert_eq!(sent, 100.0, "{what}");
            assert!(got >= sent - 1.0 && got <= sent, "{what}: {got}");
            ordered(&r, "ping.rtt", &what);
            let p50 = metric(&r, "ping.rtt_p50_us");
            assert!(p50 > 2.0 && p50 < 200.0, "{what}: {p50}");
            rtt.push(p50);
        }
        // Exitless delivery shortens the round trip.
        assert!(rtt[1] < rtt[0], "{dev}: apicv {} vs kvm {}", rtt[1], rtt[0]);
    }
}

#[test]
fn es2_workloads_run_in_other_vms_over_their_vfs() {
    // A fixed receive window: with autotuning VM 0's stream queues up to
    // 3 MiB on the port the four load generators share, and the other
    // VMs' request/response clients wait behind it (what this test looks
    // at is that every VM's traffic takes its own VF).
    let text = r#"
scheme = "apicv"
duration_s = 0.03
warmup_s = 0.01
[machine]
cores = 5
[guest]
tcp_rcvbuf = "fixed-512k"
[[vm]]
core = 1
[vm.workload.netperf]
test = "tcp-stream"
direction = "recv"
[[vm]]
core = 2
[vm.workload.nginx]
keep_alive = true
[[vm]]
core = 3
[vm.workload.ping]
interval_s = 0.001
[[vm]]
core = 4
[vm.workload.memcached]
client = "memaslap"
concurrency = 64
connections = 32
"#;
    let r = run_text(text, &[]);
    assert_eq!(r.violations(), 0);
    assert!(metric(&r, "netperf.throughput_gbps") > 0.5);
    assert!(metric(&r, "vm1.nginx.rps") > 5_000.0);
    assert_eq!(metric(&r, "vm2.ping.sent"), 30.0);
    assert!(metric(&r, "vm2.ping.received") >= 29.0);
    assert!(metric(&r, "vm3.memcached.tps") > 10_000.0);
    // Each VM's traffic went through its own VF.
    for vm in 1..4 {
        assert!(
            metric(&r, &format!("vm{vm}.nic.rx_packets")) > 0.0,
            "vm{vm}"
        );
    }
}

#[test]
fn every_es2_scenario_repeats_byte_for_byte() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/es2");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for n in &names {
        let a = serde_json::to_string(&es2(n, &["duration_s=0.01"])).unwrap();
        let b = serde_json::to_string(&es2(n, &["duration_s=0.01"])).unwrap();
        assert_eq!(a, b, "{n}");
    }
}

#[test]
fn bad_es2_keys_are_errors_that_name_the_key() {
    let base = "scheme = \"kvm\"\nduration_s = 0.01\n";
    for (body, key) in [
        (
            "[workload.netperf]\ntest = \"udp-stream\"\nmsg_bytes = 2000\n",
            "workload.netperf.msg_bytes",
        ),
        ("[workload.netperf]\nthreads = 0\n", "workload.netperf.threads"),
        ("[workload.netperf]\ntest = \"sctp\"\n", "workload.netperf.test"),
        ("[workload.nginx]\nworkers = 0\n", "workload.nginx.workers"),
        (
            "[workload.nginx]\nab_processes = 64\nconcurrency = 100\n",
            "workload.nginx.concurrency",
        ),
        ("[workload.apache]\nrequest_bytes = 3\n", "workload.apache.request_bytes"),
        ("[workload.nginx]\nkeep_alive = 1\n", "keep_alive"),
        ("[workload.apache]\nkeep_alive = \"yes\"\n", "keep_alive"),
        ("[workload.ping]\ninterval_s = 0\n", "workload.ping.interval_s"),
        ("[workload.ping]\npayload_bytes = 9000\n", "workload.ping.payload_bytes"),
        (
            "[workload.memcached]\nclient = \"memaslap\"\nrate_rps = 1000\n",
            "workload.memcached.rate_rps",
        ),
        ("[workload.memcached]\n", "workload.memcached.rate_rps"),
        (
            "[workload.memcached]\nclient = \"memaslap\"\nget_pct = 101\n",
            "workload.memcached.get_pct",
        ),
        (
            "[workload.memcached]\nclient = \"memaslap\"\nconnections = 1\nthreads = 1\nconcurrency = 100000\n",
            "workload.memcached.concurrency",
        ),
        ("[workload.nginx]\n[workload.ping]\n", "workload.ping"),
        (
            "[workload.ping]\n[workload.udp]\nrate_pps = 1000\n",
            "workload.udp",
        ),
        (
            "[machine]\ncores = 3\n[[vm]]\ncore = 1\n[vm.workload.netperf]\nthreads = 65\n",
            "vm[0].workload.netperf.threads",
        ),
    ] {
        let e = Scenario::parse(&format!("{base}{body}"), &[])
            .err()
            .unwrap_or_else(|| panic!("accepted: {body}"))
            .to_string();
        assert!(e.contains(key), "{body}: {e}");
    }
}

/// A run's provenance lists the calibration entries the user changed, not
/// every cost the experiment's clock scaled: the ES2 testbed overlay sets
/// two entries (cpu.ghz 2.3 and the link), and the run's report names
/// exactly those, while its cycle-bound costs are scaled by 3.4/2.3.
#[test]
fn provenance_names_the_changed_entries_not_the_clock_scaled_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let overlay = std::fs::read_to_string(root.join("validation/es2/testbed.toml")).unwrap();
    let cal = exitless::calibration_overlay::layered(Some(("testbed.toml", &overlay)), &[])
        .expect("overlay layers");
    let s = Scenario::load(
        &root.join("validation/did/fig4.toml"),
        &["duration_s=0.01".into()],
    )
    .expect("loads");
    let mut w = World::build(&s, &cal).expect("builds");
    w.run(|_| {});
    let changed: Vec<String> = w
        .report()
        .provenance
        .calibration_changes
        .into_keys()
        .collect();
    assert_eq!(changed, ["cpu.ghz", "nic.link_gbps"]);
}
