//! kvm-tools' userspace virtio-net back end allocates nothing per frame:
//! once the device and its back end exist, kicks, the ioeventfd thread's
//! dispatch, the TX thread's writes, the tap and the RX thread's reads
//! move without one heap allocation; and in the world a run four times as
//! long allocates no more. A counting global allocator (this test
//! binary's own, tests/common/alloc_count.rs) proves it.

use exitless::engine::NS;
use exitless::hv::kvmtool_net::{KvmtoolCosts, KvmtoolNet, Next, Role};
use exitless::hw::virtio_net::VirtioNetDev;
use exitless::hw::wire::Frame;
#[path = "common/alloc_count.rs"]
mod alloc_count;
use alloc_count::allocs;

fn run(d: &mut KvmtoolNet, vq: &mut VirtioNetDev, r: Role, c: &KvmtoolCosts) -> u64 {
    let mut sent = 0;
    loop {
        sent += u64::from(d.finish(r, vq).to_tap.is_some());
        if d.resume(r, vq, c) == Next::Sleep {
            return sent;
        }
    }
}

#[test]
fn frames_through_the_threads_allocate_nothing() {
    let c = KvmtoolCosts {
        wakeup: 3000 * NS,
        syscall: 150 * NS,
        ioeventfd_event: 300 * NS,
        tap_write: 1500 * NS,
        tap_read: 1000 * NS,
        copy_per_kib: 100 * NS,
        irq_line: 300 * NS,
    };
    let mut vq = VirtioNetDev::new(256, true, 0xC050).unwrap();
    let mut d = KvmtoolNet::new(0, 0, [1, 2], 500);
    while vq.rx_add_buffer() {}
    vq.rx_kick_prepare();
    d.kick(1);
    run(&mut d, &mut vq, Role::Ioeventfd, &c);
    run(&mut d, &mut vq, Role::Rx, &c);
    let mut seq = 0u64;
    // One round: the guest sends 32 frames and kicks if it must, the
    // threads move them; 8 frames come back and the guest refills.
    let mut round = |d: &mut KvmtoolNet, vq: &mut VirtioNetDev| -> u64 {
        vq.tx_reclaim();
        for _ in 0..32 {
            seq += 1;
            assert!(vq.tx_add(Frame::udp(1, 1400, 0, seq)));
        }
        if vq.tx_kick_prepare() {
            d.kick(2);
        }
        run(d, vq, Role::Ioeventfd, &c);
        let sent = run(d, vq, Role::Tx, &c);
        for _ in 0..8 {
            seq += 1;
            d.tap_receive(Frame::udp(1, 64, 0, seq));
        }
        run(d, vq, Role::Rx, &c);
        while vq.rx_get().is_some() {}
        while vq.rx_add_buffer() {}
        if vq.rx_kick_prepare() {
            d.kick(1);
            run(d, vq, Role::Ioeventfd, &c);
            run(d, vq, Role::Rx, &c);
        }
        sent
    };
    for _ in 0..64 {
        round(&mut d, &mut vq);
    }
    let before = allocs();
    let mut sent = 0;
    for _ in 0..1000 {
        sent += round(&mut d, &mut vq);
    }
    assert_eq!(sent, 32_000, "every frame left");
    assert_eq!(allocs() - before, 0, "the per-frame path allocated");
}

fn run_allocs(text: &str, dur_s: f64) -> u64 {
    let sets = vec![format!("duration_s={dur_s}")];
    let s = exitless::scenario::Scenario::parse(text, &sets).unwrap();
    let cal = exitless::calibration::Calibration::default_host();
    let mut w = exitless::world::World::build(&s, &cal).unwrap();
    let before = allocs();
    w.run(|_| {});
    allocs() - before
}

/// In the world (a stream and a request-response through kvm-tools'
/// threads on the vCPU's core and on a core of their own), a run four
/// times as long allocates no more.
#[test]
fn the_world_path_allocates_nothing_per_frame() {
    for (test, io) in [
        ("test = \"udp-rr\"\nmsg_bytes = 1", 1),
        ("test = \"tcp-stream\"\nmsg_bytes = 16384", 3),
    ] {
        let text = format!(
            "scheme = \"kvm\"\nseed = 1\nwarmup_s = 0.005\n[machine]\ncores = 4\n\
             [guest]\ntick = \"off\"\n[background]\nenabled = false\n\
             [net]\ndevice = \"virtio\"\npeer = \"remote\"\nbackend = \"kvmtool-tap\"\n\
             [host]\nio_cores = [{io}]\n[workload.netperf]\n{test}\n"
        );
        let short = run_allocs(&text, 0.01);
        let long = run_allocs(&text, 0.04);
        assert!(
            long <= short + 16,
            "{test}: {short} allocations in 10 ms, {long} in 40 ms"
        );
    }
}
