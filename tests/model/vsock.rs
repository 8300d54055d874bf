//! virtio-vsock with vhost-vsock, the guest sending a stream (netperf
//! TCP_STREAM's direction) to a host relay, driven round by round through
//! the real rings: the guest's transport, the device's three queues, the
//! back end's handlers and the relay's reads; then the same path as the
//! world runs it (`net.device = "virtio-vsock"`, `world::vsock`), under an
//! injecting and a posting scheme.
//!
//! Checked on every round:
//! * every byte the guest sends reaches the relay, once and in order;
//! * credit: the guest never has more bytes in flight than the host
//!   socket's `buf_alloc` (Linux 5.x `virtio_transport_get_credit`);
//! * kicks and interrupts follow EVENT_IDX: the guest kicks exactly when
//!   `vring_need_event(avail_event, new, old)` holds, the back end signals
//!   exactly when `vring_need_event(used_event, new, signalled)` holds
//!   (without EVENT_IDX: the NO_NOTIFY / NO_INTERRUPT flags).

use exitless::engine::NS;
use exitless::guest::vsock::{State, VsockConn};
use exitless::hv::vhost_vsock::{Relay, RelayCosts, Turn, VhostVsock, VsockCosts};
use exitless::hw::virtio::{
    vring_need_event, Virtqueue, VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY,
};
use exitless::hw::virtio_vsock::{Hdr, Op, VirtioVsockDev, CID_HOST, DEFAULT_BUF_SIZE};
use std::collections::VecDeque;

use crate::common::{metric, rate, run_text};

const GUEST: (u64, u32) = (3, 1025);
const PORT: u32 = 5001;

fn costs() -> VsockCosts {
    VsockCosts {
        tx_per_pkt: 500 * NS,
        rx_per_pkt: 400 * NS,
        copy_per_kib: 100 * NS,
        signal: 300 * NS,
    }
}

/// The device side's signalling state the test keeps itself, to check the
/// back end's decisions against the ring's memory.
#[derive(Default)]
struct SignalCheck {
    signalled: Option<u16>,
    checked: u64,
}

impl SignalCheck {
    /// Call before the turn (the guest does not run during it).
    fn before(q: &Virtqueue) -> (u16, u16) {
        (q.ring.used_event, q.ring.avail_flags)
    }

    fn after(&mut self, q: &Virtqueue, event_idx: bool, was: (u16, u16), t: &Turn, moved: bool) {
        if !moved {
            assert!(!t.signal, "no used buffers, no signal");
            return;
        }
        let new = q.ring.used_idx;
        let want = if event_idx {
            self.signalled
                .is_none_or(|old| vring_need_event(was.0, new, old))
        } else {
            was.1 & VRING_AVAIL_F_NO_INTERRUPT == 0
        };
        assert_eq!(t.signal, want, "signal decision at used idx {new}");
        self.signalled = Some(new);
        self.checked += 1;
    }
}

/// The guest publishes what it added; returns whether it kicked, checked
/// against the ring.
fn kick(q: &mut Virtqueue, event_idx: bool, kicks_checked: &mut u64) -> bool {
    let (old, event, flags) = (q.ring.avail_idx, q.ring.avail_event, q.ring.used_flags);
    let k = q.kick_prepare();
    let new = q.ring.avail_idx;
    let want = new != old
        && if event_idx {
            vring_need_event(event, new, old)
        } else {
            flags & VRING_USED_F_NO_NOTIFY == 0
        };
    assert_eq!(k, want, "kick decision at avail idx {new}");
    *kicks_checked += 1;
    k
}

#[derive(Debug, Default)]
struct Outcome {
    bytes: u64,
    packets: u64,
    tx_kicks: u64,
    tx_signals: u64,
    credit_stalls: u64,
    updates: u64,
    max_in_flight: u32,
}

/// The guest writes `total` bytes in writes of `write` bytes; per round it
/// queues at most `burst` packets and the relay makes `reads` reads of
/// `relay_buf` bytes.
fn stream(
    event_idx: bool,
    total: u64,
    write: u32,
    burst: u32,
    reads: u32,
    relay_buf: u32,
) -> Outcome {
    let c = costs();
    let rc = RelayCosts {
        syscall: 200 * NS,
        copy_per_kib: 50 * NS,
        select: 0,
    };
    let mut dev = VirtioVsockDev::new(128, event_idx, GUEST.0).unwrap();
    let mut b = VhostVsock::new(0, [10, 11], PORT);
    let mut relay = Relay::new(relay_buf);
    let mut out = Outcome::default();
    let mut checks = 0u64;
    let (mut tx_sig, mut rx_sig) = (SignalCheck::default(), SignalCheck::default());

    for _ in 0..64 {
        assert!(dev.post_rx_buffer());
    }
    kick(&mut dev.rx, event_idx, &mut checks);
    let (mut g, req) = VsockConn::connect(GUEST, (CID_HOST, PORT));
    assert!(dev.send(req));
    let mut tx_kicked = kick(&mut dev.tx, event_idx, &mut checks);
    assert!(tx_kicked, "the first packet always kicks");
    let mut rx_work = false;

    // Lengths of the RW packets the guest sent and the host has not yet
    // seen, in order.
    let mut sent: VecDeque<u32> = VecDeque::new();
    let mut queued = 0u64;
    let mut left_in_write = 0u32;
    let mut rounds = 0;
    while relay.bytes < total {
        rounds += 1;
        assert!(rounds < 1_000_000, "the stream stalled");

        // ---- guest: interrupt work (TX reclaim, RX), then the app ----
        while dev.tx.get_used().is_some() {}
        let mut reposted = false;
        while let Some(h) = dev.recv() {
            let (reply, ok) = g.on_packet(&h);
            assert!(ok && reply.is_none(), "{:?}", h.op);
            out.updates += u64::from(h.op == Op::CreditUpdate);
            reposted |= dev.post_rx_buffer();
        }
        if reposted && kick(&mut dev.rx, event_idx, &mut checks) {
            rx_work = true;
        }
        if g.state == State::Established {
            let mut n = 0;
            while n < burst && (queued < total || left_in_write > 0) {
                if left_in_write == 0 {
                    left_in_write = write.min((total - queued) as u32);
                    queued += u64::from(left_in_write);
                }
                if dev.tx.num_free() == 0 {
                    break;
                }
                let Some(h) = g.send(left_in_write) else {
                    out.credit_stalls += 1;
                    break;
                };
                // Credit, against the host's real state.
                let host = b.conn.as_ref().unwrap().credit;
                let in_flight = g.credit.tx_cnt.wrapping_sub(host.fwd_cnt);
                assert!(
                    in_flight <= host.buf_alloc,
                    "{in_flight} > {}",
                    host.buf_alloc
                );
                out.max_in_flight = out.max_in_flight.max(in_flight);
                assert!(dev.send(h));
                sent.push_back(h.len);
                left_in_write -= h.len;
                out.packets += 1;
                n += 1;
            }
            if n > 0 && kick(&mut dev.tx, event_idx, &mut checks) {
                tx_kicked = true;
            }
        }

        // ---- vhost-vsock worker ----
        if tx_kicked {
            out.tx_kicks += 1;
            tx_kicked = false;
            loop {
                let was = SignalCheck::before(&dev.tx);
                let used = dev.tx.ring.used_idx;
                let t = b.handle_tx_seen(&mut dev, &c, |h| {
                    if h.op == Op::Rw {
                        assert_eq!(sent.pop_front(), Some(h.len), "out of order");
                    }
                });
                let moved = dev.tx.ring.used_idx != used;
                tx_sig.after(&dev.tx, event_idx, was, &t, moved);
                out.tx_signals += u64::from(t.signal);
                rx_work |= t.rx_pending;
                if !t.requeue {
                    break;
                }
            }
        }
        // ---- relay ----
        for _ in 0..reads {
            let (n, _, update) = relay.step(&mut b, &rc);
            rx_work |= update;
            if n == 0 {
                break;
            }
        }
        if rx_work {
            let was = SignalCheck::before(&dev.rx);
            let used = dev.rx.ring.used_idx;
            let t = b.handle_rx(&mut dev, &c);
            let moved = dev.rx.ring.used_idx != used;
            rx_sig.after(&dev.rx, event_idx, was, &t, moved);
            rx_work = t.requeue;
        }
    }
    assert!(
        sent.is_empty(),
        "{} packets never reached the host",
        sent.len()
    );
    assert_eq!(relay.bytes, total, "every byte once");
    let host = b.conn.as_ref().unwrap().credit;
    assert_eq!(u64::from(host.fwd_cnt), total);
    assert_eq!(b.counters.resets, 0);
    assert!(tx_sig.checked > 0 && rx_sig.checked > 0 && checks > 0);
    out.bytes = relay.bytes;
    out
}

#[test]
fn a_guest_stream_reaches_the_relay_in_order_within_credit() {
    // netperf's 16 KiB writes; a relay reading 8 KiB (socat's default
    // buffer) twice per round: slower than the guest, so credit stalls it.
    let o = stream(true, 8 << 20, 16 * 1024, 32, 2, 8192);
    assert!(o.credit_stalls > 0, "{o:?}");
    assert!(o.updates > 0, "stalls end by credit updates: {o:?}");
    assert_eq!(
        o.max_in_flight, DEFAULT_BUF_SIZE,
        "the window is used fully"
    );
}

/// Both notification modes run the same stream, every kick and signal
/// checked against its rule inside `stream`. One kick per batch of 8
/// packets at most: the guest publishes a batch and kicks once. In these
/// lock-step rounds the worker never runs while the guest adds, so
/// EVENT_IDX and the flags decide alike here; the difference needs the
/// timed world (docs/vcanal.md, "virtio-vsock").
#[test]
fn kicks_and_signals_follow_the_ring_with_and_without_event_idx() {
    let with = stream(true, 2 << 20, 16 * 1024, 8, 16, 64 * 1024);
    let without = stream(false, 2 << 20, 16 * 1024, 8, 16, 64 * 1024);
    assert_eq!(with.bytes, without.bytes);
    for o in [&with, &without] {
        assert!(o.tx_kicks * 8 >= o.packets, "{o:?}");
        assert!(o.tx_kicks < o.packets, "batches kick once: {o:?}");
        assert!(o.tx_signals <= o.tx_kicks, "{o:?}");
    }
}

#[test]
fn a_relay_that_keeps_up_never_stalls_the_sender_on_credit() {
    let o = stream(true, 4 << 20, 16 * 1024, 4, 64, 256 * 1024);
    assert_eq!(o.credit_stalls, 0, "{o:?}");
    assert!(o.max_in_flight < DEFAULT_BUF_SIZE);
}

/// A header for a port nobody listens on is answered with RST, and the
/// guest's connection sees it.
#[test]
fn a_connect_to_a_closed_port_is_reset() {
    let mut dev = VirtioVsockDev::new(16, true, GUEST.0).unwrap();
    let mut b = VhostVsock::new(0, [10, 11], PORT);
    assert!(dev.post_rx_buffer());
    dev.rx.kick_prepare();
    let (mut g, req) = VsockConn::connect(GUEST, (CID_HOST, PORT + 1));
    assert!(dev.send(req));
    dev.tx.kick_prepare();
    let t = b.handle_tx(&mut dev, &costs());
    assert!(t.rx_pending);
    b.handle_rx(&mut dev, &costs());
    let h: Hdr = dev.recv().unwrap();
    assert_eq!(h.op, Op::Rst);
    g.on_packet(&h);
    assert_eq!(g.state, State::Closed);
}

/// One ab connection's vsock half, round by round through the real rings
/// (Linux 5.x `virtio_transport_common.c`): the host's connect() sends a
/// REQUEST, the guest's listener makes a child socket and answers with a
/// RESPONSE before the program accepts; the request goes host → guest,
/// the response guest → host; the guest's close() sends a SHUTDOWN of
/// both directions and its socket lingers; the host, with the response
/// unread, keeps its socket until the relay has read it (the stream then
/// ends), and the relay's close() is an RST, on which the guest's socket
/// goes. At the end neither side holds a socket.
#[test]
fn a_connection_opens_carries_one_exchange_and_closes_on_both_sides() {
    use exitless::guest::vsock::{VsockDriverCosts, VsockStack};
    let drv = VsockDriverCosts {
        tx_pkt: 700 * NS,
        rx_pkt: 800 * NS,
        copy_per_kib: 100 * NS,
    };
    let mut dev = VirtioVsockDev::new(64, true, GUEST.0).unwrap();
    let mut st = VsockStack::probe(&mut dev, drv, &[80, 81], 4, 8);
    let mut b = VhostVsock::new(0, [10, 11], u32::MAX).with_sockets(4);
    let c = costs();
    // Moves what each side queued until both are quiet.
    let pump = |dev: &mut VirtioVsockDev, st: &mut VsockStack, b: &mut VhostVsock| {
        for _ in 0..8 {
            b.handle_rx(dev, &c);
            st.completion_work(dev);
            b.handle_tx(dev, &c);
        }
    };
    for round in 0..3u32 {
        let hs = b.connect(2000 + round, GUEST.0, 80).expect("a host socket");
        assert_eq!(b.socks[hs].as_ref().unwrap().state, State::Connecting);
        pump(&mut dev, &mut st, &mut b);
        assert_eq!(b.socks[hs].as_ref().unwrap().state, State::Established);
        assert!(st.accept_pending(80) && !st.accept_pending(81));
        let gs = st.accept(80).expect("accepted");
        // The request, 100 bytes, host to guest.
        let req = b.socks[hs].as_mut().unwrap().send(100).unwrap();
        b.queue_for_guest(req);
        pump(&mut dev, &mut st, &mut b);
        assert_eq!(st.sock(gs).unwrap().conn.credit.rx_bytes, 100);
        assert_eq!(st.recv(&mut dev, gs, 100).0, 100);
        // The response, then close(): SHUTDOWN, the socket lingers.
        let p = st.send(&mut dev, gs, 4334);
        assert_eq!(p.bytes, 4334);
        st.close(&mut dev, gs);
        assert_eq!(st.sock(gs).unwrap().conn.state, State::Closing);
        pump(&mut dev, &mut st, &mut b);
        let h = b.socks[hs].as_mut().unwrap();
        assert_eq!(
            h.state,
            State::Established,
            "the response is unread: no RST yet"
        );
        assert!(!h.at_eof());
        assert_eq!(h.recv(8192).0, 4334);
        assert!(h.at_eof(), "the guest's stream ended");
        // The relay's close: an RST; both sockets go.
        b.close(hs);
        assert!(b.socks[hs].is_none());
        pump(&mut dev, &mut st, &mut b);
        assert!(
            st.sock(gs).is_none(),
            "round {round}: the guest's socket went"
        );
        assert_eq!(st.open(), 0);
        assert_eq!(b.sockets_open(), 0);
    }
    assert_eq!(st.counters.requests, 3);
    assert_eq!(st.counters.removed, 3);
    assert_eq!(st.counters.refused, 0);
    assert_eq!(b.counters.resets, 0);
    // A REQUEST to a port nobody listens on is reset by the guest.
    let hs = b.connect(3000, GUEST.0, 8080).unwrap();
    pump(&mut dev, &mut st, &mut b);
    assert_eq!(st.counters.refused, 1);
    assert_eq!(b.socks[hs].as_ref().unwrap().state, State::Closed);
    b.reap(hs);
    assert_eq!(b.sockets_open(), 0);
}

/// netperf TCP_STREAM over virtio-vsock through the world: the worker and
/// the relay on core 2, the vCPU on core 1; no warm-up, so every counter
/// covers the whole stream.
const WORLD: &str = r#"
seed = 1
duration_s = 0.02
warmup_s = 0.0
[machine]
cores = 3
[host]
io_cores = [2]
[net]
device = "virtio-vsock"
peer = "remote"
[workload.netperf]
test = "tcp-stream"
direction = "send"
msg_bytes = 16384
"#;

/// Every byte the guest's send() queued is, at the end, either still on
/// the TX ring, or in the host socket, or moved by the relay onto its TCP
/// connection, of which the client host acknowledged a prefix and
/// netserver read a prefix of that; nothing was dropped (the guest kept to
/// the host socket's credit, which never held more than its 256 KiB); and
/// the checker saw no lost, misdelivered or out-of-order interrupt.
#[test]
fn the_world_delivers_the_stream_once_in_order_within_credit() {
    for scheme in ["kvm", "apicv", "kvm-2026"] {
        let r = run_text(WORLD, &[&format!("scheme={scheme}")]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        let guest = metric(&r, "vsock.guest_bytes");
        let host = metric(&r, "vsock.host_rx_bytes");
        let ring = metric(&r, "vsock.tx_ring_bytes");
        let relay = metric(&r, "vsock.relay_bytes");
        let queued = metric(&r, "vsock.host_queued_bytes");
        let acked = metric(&r, "vsock.relay_tcp_acked_bytes");
        let read = metric(&r, "netperf.bytes");
        assert!(relay > 4e6, "{scheme}: a stream flowed ({relay} bytes)");
        assert_eq!(guest, host + ring, "{scheme}: ring hand-over");
        assert_eq!(host, relay + queued, "{scheme}: host socket hand-over");
        assert!(
            read <= acked && acked <= relay,
            "{scheme}: {read} <= {acked} <= {relay}"
        );
        assert_eq!(metric(&r, "vsock.dropped"), 0.0, "{scheme}: credit kept");
        assert_eq!(metric(&r, "vsock.resets"), 0.0, "{scheme}");
        let most = metric(&r, "vsock.host_queued_max_bytes");
        assert!(
            most > 0.0 && most <= f64::from(DEFAULT_BUF_SIZE),
            "{scheme}: the host socket held {most} bytes"
        );
        // The guest ran out of credit and slept until updates came.
        assert!(metric(&r, "vsock.credit_updates_per_s") > 0.0, "{scheme}");
    }
}

/// The device's interrupts (credit updates, TX completions) go through
/// the irqfd and the scheme: kvm injects each (an external-interrupt exit
/// when the vCPU runs, and an EOI MSR write exit for every one), apicv and
/// kvm-2026 post them (neither exit). The kick is an I/O-instruction exit
/// through the ioeventfd under every scheme.
#[test]
fn posted_and_injected_interrupts_differ_in_exits_as_the_scheme_says() {
    let kvm = run_text(WORLD, &["scheme=kvm"]);
    let irqs = metric(&kvm, "vsock.irqs_per_s");
    assert!(irqs > 10_000.0, "{irqs} interrupts/s");
    // Every injected interrupt's EOI exits (x2APIC, no APICv).
    assert!(
        rate(&kvm, "MSR_WRITE") >= 0.9 * irqs,
        "kvm: {:?}",
        kvm.vms[0].exits_per_s_by_reason
    );
    assert!(
        rate(&kvm, "EXTERNAL_INTERRUPT") >= 0.3 * irqs,
        "kvm: {:?}",
        kvm.vms[0].exits_per_s_by_reason
    );
    for scheme in ["apicv", "kvm-2026"] {
        let r = run_text(WORLD, &[&format!("scheme={scheme}")]);
        let irqs = metric(&r, "vsock.irqs_per_s");
        let irq_exits = rate(&r, "MSR_WRITE") + rate(&r, "EXTERNAL_INTERRUPT");
        assert!(irqs > 10_000.0, "{scheme}: {irqs} interrupts/s");
        assert_kicks_exit(&r, scheme);
        assert!(
            irq_exits < 0.2 * irqs,
            "{scheme}: {irq_exits} interrupt exits/s for {irqs} interrupts/s"
        );
    }
    assert_kicks_exit(&kvm, "kvm");
}

/// Each guest kick is one I/O-instruction exit through the ioeventfd.
fn assert_kicks_exit(r: &exitless::report::RunReport, scheme: &str) {
    let kicks = metric(r, "vsock.kicks_per_s");
    let io = rate(r, "IO_INSTRUCTION");
    assert!(
        kicks > 1000.0 && (io - kicks).abs() <= 0.05 * kicks,
        "{scheme}: {kicks} kicks/s, {io} I/O exits/s"
    );
}

/// EVENT_IDX in the timed world: after a kick the worker is queued but
/// not yet running its turn. With EVENT_IDX `avail_event` stays where its
/// last turn left it, so the packets the guest adds meanwhile do not kick;
/// without it the ring's NO_NOTIFY flag is clear until the turn starts
/// (`vhost_disable_notify`), so every packet kicks.
#[test]
fn event_idx_saves_the_kicks_made_while_the_worker_is_queued() {
    let on = run_text(WORLD, &["scheme=apicv"]);
    let off = run_text(WORLD, &["scheme=apicv", "net.event_idx=false"]);
    for r in [&on, &off] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
        assert_eq!(metric(r, "vsock.dropped"), 0.0);
    }
    let per_pkt = |r: &exitless::report::RunReport| {
        metric(r, "vsock.kicks_per_s") / metric(r, "vsock.tx_pkts_per_s")
    };
    assert!(
        per_pkt(&off) > 0.95,
        "without EVENT_IDX: {} kicks per packet",
        per_pkt(&off)
    );
    assert!(
        per_pkt(&on) < 0.8,
        "with EVENT_IDX: {} kicks per packet",
        per_pkt(&on)
    );
    assert!(rate(&off, "IO_INSTRUCTION") > rate(&on, "IO_INSTRUCTION"));
}

/// Same scenario, same seed: the same run.
#[test]
fn the_world_path_is_deterministic() {
    let a = run_text(WORLD, &["scheme=kvm"]);
    let b = run_text(WORLD, &["scheme=kvm"]);
    assert_eq!(a.metrics, b.metrics);
    assert_eq!(
        a.vms[0].exits_per_s_by_reason,
        b.vms[0].exits_per_s_by_reason
    );
}

// ---- several VMs over vsock: one worker and relay each, one I/O core ----

/// Three single-vCPU VMs, each its netperf stream over its own
/// virtio-vsock device (guest CIDs 3, 4, 5), their vhost-vsock workers and
/// relays sharing core 0 with the host NIC's softirq (as the scalability
/// run, `vcanal.scalability-vsock-tcp`); no warm-up.
const MULTI: &str = r#"
seed = 1
duration_s = 0.03
warmup_s = 0.0
[machine]
cores = 4
[host]
io_cores = [0]
[net]
device = "virtio-vsock"
peer = "remote"
[[vm]]
vcpus = 1
core = 1
copies = 3
copies_cores = [1, 2, 3]
[vm.workload.netperf]
test = "tcp-stream"
direction = "send"
msg_bytes = 16384
"#;

/// With three VMs each VM's stream arrives whole at its own netserver:
/// per VM, every byte its guest queued is on its TX ring, in its host
/// socket or moved by its relay, and its netserver read no more than its
/// own relay sent;
/// its host socket never held more than its own credit (256 KiB) and
/// dropped nothing; the host socket its relay reads was opened by its own
/// guest's CID and no packet on any TX ring was addressed from another
/// CID (no byte can cross to another VM's socket). The worker's core was
/// shared: every VM moved a share of the bytes.
#[test]
fn several_vms_each_deliver_their_own_stream_within_their_own_credit() {
    for scheme in ["kvm", "apicv"] {
        let r = run_text(MULTI, &[&format!("scheme={scheme}")]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        assert_eq!(metric(&r, "vsock.vms"), 3.0);
        let mut cids = Vec::new();
        let mut total = 0.0;
        for vm in 0..3 {
            let p = exitless::report::vm_prefix(vm);
            let m = |k: &str| metric(&r, &format!("{p}{k}"));
            let (guest, host, ring) = (
                m("vsock.guest_bytes"),
                m("vsock.host_rx_bytes"),
                m("vsock.tx_ring_bytes"),
            );
            let (relay, queued, acked, read) = (
                m("vsock.relay_bytes"),
                m("vsock.host_queued_bytes"),
                m("vsock.relay_tcp_acked_bytes"),
                m("netperf.bytes"),
            );
            assert!(
                relay > 1e6,
                "{scheme} VM {vm}: its stream flowed ({relay} bytes)"
            );
            assert_eq!(guest, host + ring, "{scheme} VM {vm}: ring hand-over");
            assert_eq!(
                host,
                relay + queued,
                "{scheme} VM {vm}: host socket hand-over"
            );
            // Its netserver read no more than its own relay sent (its ACKs
            // may still be on the wire, so acked can trail what it read).
            assert!(
                read > 0.0 && read <= relay && acked <= relay,
                "{scheme} VM {vm}: read {read}, acked {acked}, relayed {relay}"
            );
            assert_eq!(m("vsock.dropped"), 0.0, "{scheme} VM {vm}: credit kept");
            assert_eq!(m("vsock.misaddressed"), 0.0, "{scheme} VM {vm}");
            assert_eq!(m("vsock.resets"), 0.0, "{scheme} VM {vm}");
            let most = m("vsock.host_queued_max_bytes");
            assert!(
                most > 0.0 && most <= f64::from(DEFAULT_BUF_SIZE),
                "{scheme} VM {vm}: its host socket held {most} bytes"
            );
            let cid = m("vsock.guest_cid");
            assert_eq!(m("vsock.host_conn_peer_cid"), cid, "{scheme} VM {vm}");
            cids.push(cid);
            total += read;
        }
        assert_eq!(cids, [3.0, 4.0, 5.0], "{scheme}: a CID per VM");
        // The aggregate is the netservers' bytes over the run.
        let agg = metric(&r, "vsock.aggregate_gbps");
        assert!(
            (agg - total * 8.0 / 0.03 / 1e9).abs() < 1e-9,
            "{scheme}: {agg} Gb/s for {total} bytes"
        );
    }
}

/// Several VMs over vsock: same scenario, same seed, the same run.
#[test]
fn several_vms_over_vsock_are_deterministic() {
    let a = run_text(MULTI, &["scheme=apicv"]);
    let b = run_text(MULTI, &["scheme=apicv"]);
    assert_eq!(a.metrics, b.metrics);
    for vm in 0..3 {
        assert_eq!(
            a.vms[vm].exits_per_s_by_reason,
            b.vms[vm].exits_per_s_by_reason
        );
    }
}

/// ApacheBench over vsock stays a one-VM configuration: a second VM
/// serving over vsock is refused with the key named.
#[test]
fn ab_over_vsock_on_two_vms_is_refused_naming_the_key() {
    let text = MULTI.replace(
        "[vm.workload.netperf]\ntest = \"tcp-stream\"\ndirection = \"send\"\nmsg_bytes = 16384\n",
        "[vm.workload.nginx]\n",
    );
    let s =
        exitless::scenario::Scenario::parse(&text, &["scheme=apicv".to_string()]).expect("parses");
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .expect("refused");
    assert!(
        e.to_string()
            .contains("net.device: ApacheBench over virtio-vsock is modelled for one VM"),
        "{e}"
    );
}

// ---- ApacheBench over vsock: a connection per request ----

/// vcanal.ab's workload over virtio-vsock (`validation/vcanal/vsock-ab.toml`)
/// from t = 0, so the counters are totals.
fn run_ab(sets: &[&str]) -> exitless::report::RunReport {
    run_ab_with(sets, |_| {})
}

/// [`run_ab`] with a calibration changed by `tweak`.
fn run_ab_with(
    sets: &[&str],
    tweak: impl FnOnce(&mut exitless::calibration::Calibration),
) -> exitless::report::RunReport {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("validation/vcanal/vsock-ab.toml");
    let mut all: Vec<String> = vec!["warmup_s=0".into(), "duration_s=0.04".into()];
    all.extend(sets.iter().map(|s| s.to_string()));
    let s = exitless::scenario::Scenario::load(&path, &all).expect("scenario loads");
    let mut cal = exitless::calibration::Calibration::default_host();
    tweak(&mut cal);
    let mut w = exitless::world::World::build(&s, &cal).expect("world builds");
    w.run(|_| {});
    w.report()
}

/// ab's 16 connection slots over many connections: every request ab
/// wrote was answered (the server served what ab completed, up to the
/// requests in flight), every connection the relay opened to the guest
/// was accepted, and every one that finished was closed on both sides:
/// the guest's sockets removed (SHUTDOWN, then the relay's RST), the
/// relay's children exited and their host sockets freed, so what is
/// open at the end is bounded by the connections in flight, not by the
/// run's length. Nothing was refused, reset or dropped (credit kept).
#[test]
fn ab_over_vsock_answers_every_request_and_closes_every_connection() {
    for scheme in ["kvm", "apicv"] {
        let r = run_ab(&[&format!("scheme={scheme}")]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        let m = |k: &str| metric(&r, k);
        let conns = 16.0;
        let completed = m("nginx.completed");
        let served = m("nginx.served.worker0") + m("nginx.served.worker1");
        assert!(completed > 200.0, "{scheme}: {completed} requests");
        assert!(
            served >= completed && served - completed <= conns,
            "{scheme}: served {served}, ab completed {completed}"
        );
        // Both server threads served their share.
        assert!(m("nginx.served.worker0") > 0.3 * served, "{scheme}");
        assert!(m("nginx.served.worker1") > 0.3 * served, "{scheme}");
        // Guest side: each REQUEST made a socket; the sockets still in
        // the table are those not yet reset by the relay.
        let requests = m("vsock.guest_requests");
        let removed = m("vsock.guest_removed");
        let open = m("vsock.guest_socks_open");
        assert_eq!(requests - removed, open, "{scheme}: guest table");
        assert!(open <= 2.0 * conns, "{scheme}: {open} guest sockets open");
        assert!(removed >= completed - conns, "{scheme}: {removed} closed");
        assert!(m("vsock.guest_accepted") >= served, "{scheme}");
        // Host side: each accepted TCP connection forked a relay; the
        // relays still alive are those in flight.
        let forks = m("vsock.relay_forks");
        let exits = m("vsock.relay_exits");
        let live = m("vsock.relay_children");
        assert_eq!(forks - exits, live, "{scheme}: relay processes");
        assert!(live <= 2.0 * conns, "{scheme}: {live} relays alive");
        assert!(m("vsock.host_socks_open") <= live, "{scheme}");
        assert!(
            exits >= completed - conns,
            "{scheme}: {exits} relays exited"
        );
        for k in [
            "vsock.guest_refused",
            "vsock.relay_refused",
            "vsock.resets",
            "vsock.dropped",
            "vsock.guest_dropped",
        ] {
            assert_eq!(m(k), 0.0, "{scheme}: {k}");
        }
        let most = m("vsock.host_queued_max_bytes");
        assert!(
            most > 0.0 && most <= f64::from(DEFAULT_BUF_SIZE),
            "{scheme}"
        );
    }
}

/// A response larger than the relay socket's buffer (256 KiB): the
/// guest's send() runs out of credit, sleeps until the relay's reads
/// return it (CREDIT_UPDATE), and every response still arrives whole,
/// with nothing dropped and the host socket never past its buffer. (ab's
/// model reads a response once it is whole, so its window must hold one:
/// a fixed 512 KiB receive buffer.)
#[test]
fn a_response_larger_than_the_credit_waits_for_credit_updates() {
    let r = run_ab(&[
        "scheme=apicv",
        "vm.0.workload.nginx.page_bytes=300000",
        "guest.tcp_rcvbuf=\"fixed-512k\"",
    ]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    let m = |k: &str| metric(&r, k);
    assert!(m("nginx.completed") > 20.0, "{}", m("nginx.completed"));
    assert_eq!(m("nginx.completed"), m("vsock.relay_exits"));
    assert!(m("vsock.guest_credit_stalls") > 0.0);
    assert!(m("vsock.credit_updates_per_s") > 0.0);
    assert_eq!(m("vsock.dropped"), 0.0);
    assert_eq!(m("vsock.guest_dropped"), 0.0);
    let most = m("vsock.host_queued_max_bytes");
    assert!(
        most > f64::from(DEFAULT_BUF_SIZE) / 2.0 && most <= f64::from(DEFAULT_BUF_SIZE),
        "the relay socket held {most} bytes"
    );
}

/// The relay's interrupts and kicks go through the scheme as the stream's
/// do: kvm injects the device's interrupts (an EOI exit each), apicv
/// posts them; each guest kick is one I/O-instruction exit. The rate is
/// the host core's (forks), which posting does not move.
#[test]
fn ab_over_vsock_exits_follow_the_scheme() {
    let kvm = run_ab(&["scheme=kvm"]);
    let apicv = run_ab(&["scheme=apicv"]);
    let irqs = metric(&kvm, "vsock.irqs_per_s");
    assert!(irqs > 1000.0, "{irqs}");
    assert!(rate(&kvm, "MSR_WRITE") >= 0.9 * irqs);
    let posted_irq_exits = rate(&apicv, "MSR_WRITE") + rate(&apicv, "EXTERNAL_INTERRUPT");
    assert!(posted_irq_exits < 0.3 * metric(&apicv, "vsock.irqs_per_s"));
    assert_kicks_exit(&kvm, "kvm");
    assert_kicks_exit(&apicv, "apicv");
    let (a, b) = (metric(&kvm, "nginx.rps"), metric(&apicv, "nginx.rps"));
    assert!((a - b).abs() < 0.05 * a, "kvm {a}, apicv {b} req/s");
    // The relay's per-connection cost is what bounds it: with no fork the
    // same core serves more than twice the requests.
    let free = run_ab_with(&["scheme=apicv"], |c| c.vsock.relay_fork_us.value = 0.0);
    assert!(metric(&free, "nginx.rps") > 2.0 * b);
}

/// Same scenario, same seed: the same ab run.
#[test]
fn ab_over_vsock_is_deterministic() {
    let a = run_ab(&["scheme=apicv"]);
    let b = run_ab(&["scheme=apicv"]);
    assert_eq!(a.metrics, b.metrics);
    assert_eq!(
        a.vms[0].exits_per_s_by_reason,
        b.vms[0].exits_per_s_by_reason
    );
}
