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

/// ApacheBench's vsock half, a connection per request: the relay's
/// connect (REQUEST), the guest's child socket and RESPONSE, accept, the
/// request and the response, the guest's close (SHUTDOWN) and the relay's
/// read and close (RST), the sockets freed on both sides: after a warm-up
/// every connection reuses the table slots and queues the first ones
/// grew, so a connection allocates nothing.
#[test]
fn a_connection_per_request_allocates_nothing() {
    use exitless::guest::vsock::VsockStack;
    let mut dev = VirtioVsockDev::new(128, true, 3).unwrap();
    let costs = VsockDriverCosts {
        tx_pkt: 700 * NS,
        rx_pkt: 800 * NS,
        copy_per_kib: 100 * NS,
    };
    let mut st = VsockStack::probe(&mut dev, costs, &[80, 81], 511, 64);
    let mut back = VhostVsock::new(0, [1, 2], u32::MAX).with_sockets(32);
    let vc = VsockCosts {
        tx_per_pkt: 1000 * NS,
        rx_per_pkt: 700 * NS,
        copy_per_kib: 100 * NS,
        signal: 300 * NS,
    };
    let mut port = 1024u32;
    let mut conn = |dev: &mut VirtioVsockDev| -> u32 {
        let pump = |dev: &mut VirtioVsockDev, st: &mut VsockStack, b: &mut VhostVsock| {
            for _ in 0..4 {
                b.handle_rx(dev, &vc);
                st.completion_work(dev);
                b.handle_tx(dev, &vc);
            }
        };
        port += 1;
        let hs = back.connect(port, 3, 80 + port % 2).unwrap();
        pump(dev, &mut st, &mut back);
        let gs = st.accept(80 + port % 2).unwrap();
        let req = back.socks[hs].as_mut().unwrap().send(100).unwrap();
        back.queue_for_guest(req);
        pump(dev, &mut st, &mut back);
        st.recv(dev, gs, 100);
        st.send(dev, gs, 4334);
        st.close(dev, gs);
        pump(dev, &mut st, &mut back);
        let (n, _) = back.socks[hs].as_mut().unwrap().recv(8192);
        back.close(hs);
        pump(dev, &mut st, &mut back);
        assert_eq!(st.open(), 0);
        assert_eq!(back.sockets_open(), 0);
        n
    };
    for _ in 0..64 {
        conn(&mut dev);
    }
    let before = allocs();
    let mut bytes = 0;
    for _ in 0..1000 {
        bytes += conn(&mut dev);
    }
    assert_eq!(bytes, 1000 * 4334, "every response arrived");
    assert_eq!(allocs() - before, 0, "a connection allocated");
}
