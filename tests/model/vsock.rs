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
