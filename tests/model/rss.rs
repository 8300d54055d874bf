//! Receive-side scaling on a native kernel's NIC (`net.queues`): each
//! queue pair's interrupt lands on its vector's CPU, nothing is lost or
//! misdelivered with eight queues, one queue is the old single-queue
//! path, and bad settings are refused by key.

use crate::common;
use common::*;

/// ApacheBench against a native 8-CPU server (vcanal.ab-paper-size's
/// native row, shortened); the client ports from 33000 spread its 16
/// connections over all eight queues.
fn native(extra: &[&str]) -> Vec<String> {
    let mut sets: Vec<String> = [
        "machine.cores=9",
        "scheme=bare-metal",
        "net.device=vf",
        "vm.0.vcpus=8",
        "vm.0.cores=[1, 2, 3, 4, 5, 6, 7, 8]",
        "net.client_port_base=33000",
        "duration_s=0.04",
        "warmup_s=0.01",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sets.extend(extra.iter().map(|s| s.to_string()));
    sets
}

fn run_native(extra: &[&str]) -> exitless::report::RunReport {
    let sets = native(extra);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    run_path("validation/vcanal/ab.toml", &sets)
}

/// With eight queues every frame is received once, on some queue (the
/// per-queue counts add up to the NIC's), none is missed, the checker
/// finds nothing lost or misdelivered, and TCP never retransmits (a
/// flow's frames stay in order on their queue).
#[test]
fn eight_queues_lose_and_misdeliver_nothing() {
    let r = run_native(&["net.queues=8"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations.first());
    let rx = metric(&r, "nic.rx_packets");
    assert!(rx > 1000.0, "{rx} frames");
    let per_queue: Vec<f64> = (0..8)
        .map(|q| metric(&r, &format!("nic.rx_packets.q{q}")))
        .collect();
    assert_eq!(per_queue.iter().sum::<f64>(), rx, "{per_queue:?}");
    assert!(
        per_queue.iter().all(|&n| n > 0.0),
        "every queue receives: {per_queue:?}"
    );
    assert_eq!(metric(&r, "nic.rx_missed"), 0.0);
    assert_eq!(metric(&r, "guest.tcp_retransmits"), 0.0);
    assert!(metric(&r, "nginx.completed") > 500.0);
    // One queue: the old path, no per-queue rows.
    let one = run_native(&[]);
    assert!(!one.metrics.contains_key("nic.rx_packets.q0"));
}

/// Every queue's interrupt (vector 0x41 + q) is delivered on CPU q, the
/// CPU its affinity hint names, and every queue's vector fires.
#[test]
fn each_queue_interrupts_its_own_cpu() {
    let dir = std::env::temp_dir().join(format!("exitless-rss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("trace.json");
    let mut args: Vec<String> = vec![
        "-q".into(),
        "run".into(),
        "validation/vcanal/ab.toml".into(),
        "--trace".into(),
        trace.display().to_string(),
        "--trace-window".into(),
        "0:20".into(),
    ];
    for s in native(&["net.queues=8"]) {
        args.push("--set".into());
        args.push(s);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = exitless(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).expect("trace written");
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&text).expect("trace is JSON");
    let events = v["traceEvents"].as_array().expect("trace events");
    let mut seen = [0u32; 8];
    for e in events {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        // "vm0 vcpuN: irq 0xVV"
        let Some((who, irq)) = name.split_once(": irq 0x") else {
            continue;
        };
        let Some(cpu) = who.strip_prefix("vm0 vcpu") else {
            continue;
        };
        let cpu: usize = cpu.parse().expect("a CPU number");
        let vector = u8::from_str_radix(irq, 16).expect("a hex vector");
        if let Some(q) = vector.checked_sub(0x41).filter(|&q| q < 8) {
            assert_eq!(
                usize::from(q),
                cpu,
                "queue {q}'s vector {vector:#x} on CPU {cpu}"
            );
            seen[usize::from(q)] += 1;
        }
    }
    assert!(
        seen.iter().all(|&n| n > 0),
        "every queue's vector fired: {seen:?}"
    );
}

/// Same scenario and seed: byte-identical reports with eight queues.
#[test]
fn eight_queues_are_deterministic() {
    let a = serde_json::to_string(&run_native(&["net.queues=8"])).expect("JSON");
    let b = serde_json::to_string(&run_native(&["net.queues=8"])).expect("JSON");
    assert_eq!(a, b);
}

/// Bad settings are refused by key: out of range, a virtualized scheme,
/// more queues than CPUs, a device without the NIC's rings.
#[test]
fn bad_queue_settings_name_the_key() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("validation/vcanal/ab.toml"),
    )
    .expect("scenario file");
    let parse = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        exitless::scenario::Scenario::parse(&text, &sets)
    };
    for (sets, want) in [
        (vec!["net.queues=0"], "net.queues"),
        (vec!["net.queues=17"], "net.queues"),
        (vec!["net.device=vf", "net.queues=2"], "bare-metal"),
        (
            vec![
                "scheme=bare-metal",
                "net.device=vf",
                "net.client_port_base=80",
            ],
            "net.client_port_base",
        ),
    ] {
        let e = parse(&sets)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want), "{sets:?}: {e}");
    }
    // Two queues on a 1-CPU native kernel: refused when the world is built.
    let s = parse(&["scheme=bare-metal", "net.device=vf", "net.queues=2"]).expect("parses");
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("net.queues") && e.contains("CPUs"), "{e}");
}

/// A native SMP kernel's idle-polling CPUs see a wake-up another CPU
/// sends them at once (TIF_POLLING_NRFLAG: no IPI, the poke): with the
/// tick stopped while idle, the server thread on CPU 1, woken by the
/// receive path on CPU 0 (one queue), keeps serving (here more than the
/// thread on CPU 0, which shares its CPU with the receive path). Before
/// the fix its pokes were lost and it served none.
#[test]
fn a_native_kernels_wake_ups_reach_every_cpu() {
    let r = run_native(&["guest.tick=nohz-idle"]);
    assert_eq!(r.violations(), 0);
    let (w0, w1) = (
        metric(&r, "nginx.served.worker0"),
        metric(&r, "nginx.served.worker1"),
    );
    assert!(w0 > 100.0 && w1 > 100.0, "served {w0} and {w1}");
}

/// One netperf stream on a native 8-queue NIC, sent and received, over
/// runs short enough that few deliveries fall in the window: its
/// throughput (first to last byte) and the aggregate over the interval
/// never exceed the 10 GbE link (issue 38 named an 18.25 Gb/s reading of
/// this case).
#[test]
fn one_stream_over_eight_queues_stays_under_the_link() {
    for direction in ["send", "recv"] {
        for duration in ["0.002", "0.01"] {
            let text = format!(
                "name = \"rss-one-stream\"\nscheme = \"bare-metal\"\nseed = 1\n\
                 duration_s = {duration}\nwarmup_s = 0.0\n\n[machine]\ncores = 9\n\n\
                 [net]\ndevice = \"vf\"\npeer = \"remote\"\nqueues = 8\n\n\
                 [[vm]]\nvcpus = 8\ncores = [1, 2, 3, 4, 5, 6, 7, 8]\n\n\
                 [vm.workload.netperf]\ntest = \"tcp-stream\"\ndirection = \"{direction}\"\n\
                 msg_bytes = 16384\n"
            );
            let r = run_text(&text, &[]);
            assert_eq!(r.violations(), 0);
            let link = 10.0;
            for m in ["netperf.throughput_gbps", "netperf.aggregate_gbps"] {
                let g = metric(&r, m);
                assert!(
                    g > 1.0 && g <= link,
                    "{direction} over {duration} s: {m} = {g} Gb/s on a {link} Gb/s link"
                );
            }
        }
    }
}
