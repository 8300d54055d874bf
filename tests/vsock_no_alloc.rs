//! virtio-vsock's per-packet hot path allocates nothing: once the device,
//! the guest driver, the back end and the relay exist, a stream's packets
//! (the guest's send path and completion work, the worker's TX and RX
//! handlers, the relay's reads and the credit updates they return) move
//! without one heap allocation. A counting global allocator (this test
//! binary's own, tests/common/alloc_count.rs) proves it.

use exitless::engine::NS;
use exitless::guest::vsock::{State, VsockDriver, VsockDriverCosts};
use exitless::hv::vhost_vsock::{Relay, RelayCosts, VhostVsock, VsockCosts};
use exitless::hw::virtio_vsock::{VirtioVsockDev, CID_HOST};
#[path = "common/alloc_count.rs"]
mod alloc_count;
use alloc_count::allocs;

#[test]
fn a_stream_of_packets_allocates_nothing() {
    let mut dev = VirtioVsockDev::new(128, true, 3).unwrap();
    let costs = VsockDriverCosts {
        tx_pkt: 700 * NS,
        rx_pkt: 800 * NS,
        copy_per_kib: 100 * NS,
    };
    let (mut drv, req) = VsockDriver::probe(&mut dev, (3, 1024), (CID_HOST, 5000), costs);
    let mut back = VhostVsock::new(0, [1, 2], 5000);
    let vc = VsockCosts {
        tx_per_pkt: 1000 * NS,
        rx_per_pkt: 700 * NS,
        copy_per_kib: 100 * NS,
        signal: 300 * NS,
    };
    let rc = RelayCosts {
        syscall: 150 * NS,
        copy_per_kib: 100 * NS,
        select: 600 * NS,
    };
    let mut relay = Relay::new(8192);
    drv.queue_control(&mut dev, req);
    back.handle_tx(&mut dev, &vc);
    back.handle_rx(&mut dev, &vc);
    drv.completion_work(&mut dev);
    assert_eq!(drv.conn.state, State::Established);

    // One round: the guest sends what credit allows, the worker takes it,
    // the relay drains it (returning credit), the worker delivers the
    // update, the guest's completion work takes it.
    let mut round = |dev: &mut VirtioVsockDev| -> u64 {
        let p = drv.send(dev, 64 * 1024);
        back.handle_tx(dev, &vc);
        while relay.step(&mut back, &rc).0 > 0 {}
        back.handle_rx(dev, &vc);
        drv.completion_work(dev);
        u64::from(p.bytes)
    };
    // Warm up: every queue reaches the size it keeps.
    for _ in 0..64 {
        round(&mut dev);
    }
    let before = allocs();
    let mut sent = 0;
    for _ in 0..1000 {
        sent += round(&mut dev);
    }
    assert!(sent > 10 << 20, "a stream flowed: {sent} bytes");
    assert_eq!(allocs() - before, 0, "the per-packet path allocated");
}
