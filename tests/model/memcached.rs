//! Memcached with many connections: every request is answered, each
//! worker thread serves its share of the connections, and DID removes the
//! interrupt exits.

use crate::common;
use common::*;

#[test]
fn memcached_answers_every_request_over_200_connections() {
    for (scheme, device) in [
        ("kvm", "vf"),
        ("did", "vf"),
        ("kvm", "virtio"),
        ("did", "virtio"),
    ] {
        let r = run_file(
            "memcached.toml",
            &[
                &format!("scheme={scheme}"),
                &format!("net.device={device}"),
                "rate_rps=30000",
                "duration_s=0.05",
            ],
        );
        assert_eq!(
            r.violations(),
            0,
            "{scheme}/{device}: {:?}",
            r.invariants.violations
        );
        let done = metric(&r, "memcached.completed");
        // 30K/s for 50 ms, give or take the Poisson count and the edges.
        assert!(
            (1300.0..=1700.0).contains(&done),
            "{scheme}/{device}: {done}"
        );
        assert!(metric(&r, "memcached.within_10ms_pct") > 99.0);
        // Both worker threads served (connections split between them).
        let t0 = metric(&r, "memcached.served.thread0");
        let t1 = metric(&r, "memcached.served.thread1");
        assert!(t0 > 0.3 * done && t1 > 0.3 * done, "{t0} {t1}");
        if scheme == "did" && device == "vf" {
            assert_eq!(rate(&r, "EXTERNAL_INTERRUPT"), 0.0);
        }
    }
}

#[test]
fn overload_misses_the_qos_bound() {
    // Far beyond what one vCPU serves: the backlog grows and the share of
    // requests within 10 ms collapses.
    let r = run_file(
        "memcached.toml",
        &["scheme=kvm", "rate_rps=600000", "duration_s=0.05"],
    );
    assert!(metric(&r, "memcached.within_10ms_pct") < 95.0);
    assert_eq!(r.violations(), 0);
    // The interval's counters add up once the requests the warm-up left
    // open are counted: each one sent is answered or still open.
    let start = metric(&r, "memcached.outstanding_at_start");
    assert!(
        start > 0.0,
        "an overloaded server has requests open at the start"
    );
    let sent = metric(&r, "memcached.sent");
    let done = metric(&r, "memcached.completed");
    let open = metric(&r, "memcached.outstanding");
    assert_eq!(
        start + sent,
        done + open,
        "{start} + {sent} vs {done} + {open}"
    );
}

#[test]
fn one_connection_and_one_worker_answer_requests() {
    // A single connection served by a single worker thread still goes
    // through the worker's epoll loop.
    for scheme in ["kvm", "did"] {
        let r = run_file(
            "memcached.toml",
            &[
                &format!("scheme={scheme}"),
                "rate_rps=20000",
                "duration_s=0.05",
                "workload.memcached.connections=1",
                "workload.memcached.threads=1",
            ],
        );
        let done = metric(&r, "memcached.completed");
        // 20K/s for 50 ms, give or take the Poisson count and the edges.
        assert!((800.0..=1200.0).contains(&done), "{scheme}: {done}");
        // Served by the one worker (the window's edges aside).
        let served = metric(&r, "memcached.served.thread0");
        assert!((served - done).abs() <= 5.0, "{scheme}: {served} vs {done}");
        assert!(metric(&r, "memcached.within_10ms_pct") > 99.0);
    }
}

#[test]
fn a_rate_beyond_the_client_places_no_more_than_offered_and_stays_bounded() {
    use exitless::workloads::memcached::{BACKLOG_LIMIT, PIPELINE_DEPTH};
    // 5M requests/s: more than the client's CPUs write (150 ns a request
    // plus its segments) and far more than the server answers.
    let rate = 5e6;
    let r = run_file(
        "memcached.toml",
        &[
            "scheme=kvm",
            "rate_rps=5000000",
            "warmup_s=0.01",
            "duration_s=0.02",
        ],
    );
    assert_eq!(r.violations(), 0);
    // Everything ever written (answered in the window or still open) is
    // within what 30 ms of arrivals offer.
    let written = metric(&r, "memcached.completed") + metric(&r, "memcached.outstanding");
    assert!(written <= rate * 0.03 * 1.01, "{written} written");
    // What the window offered is the Poisson count of 20 ms at the rate
    // (the last few microseconds may be after the client's last run).
    let offered = metric(&r, "memcached.offered");
    let mean = rate * 0.02;
    assert!(
        (0.99 * mean..=mean + 5.0 * mean.sqrt()).contains(&offered),
        "{offered} offered"
    );
    let sent = metric(&r, "memcached.sent");
    assert!(sent <= offered, "{sent} sent of {offered}");
    // The rest waits in a bounded backlog or is counted as never sent.
    assert!(metric(&r, "memcached.not_sent") > 0.0);
    assert!(metric(&r, "memcached.backlog_peak") <= BACKLOG_LIMIT as f64);
    assert!(metric(&r, "memcached.outstanding") <= (200 * PIPELINE_DEPTH) as f64);
    assert!(metric(&r, "memcached.within_10ms_pct") < 95.0);
}

/// The client as threads on the VM's host (`host.peer_cores`, here core 0,
/// with the vhost worker on a core of its own; one client thread, whose
/// sleeper credit of half a CFS period is soon spent): it runs under the
/// host scheduler, so two host threads at nice -20 on its core leave it
/// about 1% of it (CFS weights 1024 against 2 x 88761) and the requests it
/// would send and answer mostly are not.
#[test]
fn a_client_on_the_host_runs_only_when_its_core_is_given_to_it() {
    let run = |burners: &str| {
        let mut sets = vec![
            "scheme=kvm",
            "net.device=virtio",
            "machine.cores=3",
            "host.io_cores=[2]",
            "host.peer_cores=[0]",
            "workload.memcached.client_threads=1",
            "rate_rps=30000",
            "duration_s=0.05",
        ];
        if !burners.is_empty() {
            sets.push(burners);
        }
        let r = run_file("memcached.toml", &sets);
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
        r
    };
    let alone = run("");
    let starved = run("host.burners=[{cores=[0],nice=-20}, {cores=[0],nice=-20}]");
    let done = metric(&alone, "memcached.completed");
    assert!((1300.0..=1700.0).contains(&done), "{done}");
    let cpu = metric(&alone, "host.peer_threads_cpu_pct");
    assert!(cpu > 5.0, "the client used {cpu}% of a core");
    let starved_done = metric(&starved, "memcached.completed");
    assert!(starved_done < 0.1 * done, "{starved_done} of {done}");
    let starved_cpu = metric(&starved, "host.peer_threads_cpu_pct");
    assert!(starved_cpu < 0.5 * cpu, "{starved_cpu}% vs {cpu}%");
    assert!(metric(&starved, "host.peer_threads_wait_pct") > 50.0);
}

/// A client sharing the vhost worker's core keeps the worker from running
/// the moment it is kicked: the guest's later responses find notification
/// off (EVENT_IDX) and do not kick. With a client on cores of its own
/// nearly every response kicks.
#[test]
fn a_client_on_the_vhost_core_batches_the_guests_kicks() {
    let run = |peer_cores: &str| {
        let r = run_file(
            "memcached.toml",
            &[
                "scheme=did",
                "net.device=virtio",
                peer_cores,
                "rate_rps=140000",
                "duration_s=0.05",
            ],
        );
        assert_eq!(r.violations(), 0);
        metric(&r, "vhost.tx_kicks_per_frame")
    };
    let own = run("machine.cores=2");
    let shared = run("host.peer_cores=[0]");
    assert!(own > 0.5, "{own} kicks per frame");
    assert!(shared < 0.5 * own, "{shared} vs {own} kicks per frame");
}

/// `net.vf_peer = "host"`: the VF guest's client is a process on its own
/// host, reached through the PF and the NIC's embedded switch.
#[test]
fn a_vf_client_on_the_host_goes_through_the_embedded_switch() {
    for scheme in ["kvm", "did"] {
        let r = run_file(
            "memcached.toml",
            &[
                &format!("scheme={scheme}"),
                "net.vf_peer=host",
                "host.peer_cores=[0,1]",
                "rate_rps=30000",
                "duration_s=0.05",
            ],
        );
        assert_eq!(r.violations(), 0, "{scheme}");
        let done = metric(&r, "memcached.completed");
        assert!((1300.0..=1700.0).contains(&done), "{scheme}: {done}");
        assert!(metric(&r, "nic.rx_packets") > 1000.0, "{scheme}");
        assert!(metric(&r, "host.peer_threads_cpu_pct") > 1.0, "{scheme}");
    }
}
