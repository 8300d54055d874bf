//! vCanal's per-INR hot path allocates nothing: once the library, channel
//! and service exist, a call's whole journey — libCanal's submit (fd map,
//! radix cache, INR pool, ring), the service's turn (copy, checks, class
//! queue, scheduler, issue), the completion and the guest's wait — runs
//! without one heap allocation. A counting global allocator (this test
//! binary's own, tests/common/alloc_count.rs) proves it.

use exitless::guest::libcanal::inr::{Buf, Call, SockType};
use exitless::guest::libcanal::{LibCanal, LibCanalParams, WaitStep};
use exitless::hv::vcanal::channel::ChannelLayout;
use exitless::hv::vcanal::service::{Dispatch, Outcome, Service, ServiceParams};
use exitless::hw::guest_memory::GuestMemory;
#[path = "common/alloc_count.rs"]
mod alloc_count;
use alloc_count::allocs;

/// Guest page tables: GVA 0x7f00_0000_0000 + x → GPA 16 MiB + x.
fn walk(gva_page: u64) -> Option<u64> {
    Some(0x100_0000 + gva_page.checked_sub(0x7f00_0000_0000)?)
}

#[test]
fn a_call_round_trip_allocates_nothing() {
    let layout = ChannelLayout {
        base: 0x10000,
        ring_capacity: 64,
        pool_len: 64,
    };
    let mut mem = GuestMemory::new(1 << 30, layout.base, layout.size() as usize).unwrap();
    layout.init(&mut mem).unwrap();
    let mut svc = Service::new(1, ServiceParams::default());
    svc.announce(0, layout, &mem).unwrap();
    let mut lib = LibCanal::new(LibCanalParams::default(), layout);

    // One call: submit, one service turn, the pool thread's completion,
    // the guest's polls until done.
    let mut round_trip = |call: Call<i32>, mem: &mut GuestMemory| -> i64 {
        let mut s = lib.submit(mem, call, walk).unwrap();
        let mut issued: Option<Dispatch> = None;
        svc.turn(mem, 8, |d| issued = Some(d)).unwrap();
        let d = issued.expect("issued");
        let o = match d.new_slot {
            Some((i, _)) => Outcome::NewSocket(1000 + i),
            None => Outcome::Value(d.call.buf().map_or(0, |b| b.len)),
        };
        svc.complete(&d, o, None, mem).unwrap();
        loop {
            if let WaitStep::Done(c) = lib.wait(mem, &mut s.pending).unwrap() {
                return c.ret.unwrap();
            }
        }
    };

    let fd = round_trip(
        Call::Socket {
            ty: SockType::Stream,
            protocol: 0,
        },
        &mut mem,
    ) as i32;
    let send = Call::Send {
        fd,
        buf: Buf {
            addr: 0x7f00_0000_0100,
            len: 9000,
        },
        flags: 0,
    };
    // Warm: the buffer's pages are in the radix cache now.
    assert_eq!(round_trip(send, &mut mem), 9000);

    let before = allocs();
    for _ in 0..1000 {
        assert_eq!(round_trip(send, &mut mem), 9000);
    }
    // A radix miss (cache flushed) allocates nothing either.
    lib_flush_and_send(&mut mem, &mut lib, &mut svc, send);
    assert_eq!(allocs() - before, 0, "the hot path allocated");
}

/// A send whose buffer misses the radix cache.
fn lib_flush_and_send(
    mem: &mut GuestMemory,
    lib: &mut LibCanal,
    svc: &mut Service,
    send: Call<i32>,
) {
    lib.cache.flush();
    let mut s = lib.submit(mem, send, walk).unwrap();
    assert!(s.misses > 0);
    let mut issued = None;
    svc.turn(mem, 8, |d| issued = Some(d)).unwrap();
    svc.complete(&issued.unwrap(), Outcome::Value(1), None, mem)
        .unwrap();
    while !matches!(lib.wait(mem, &mut s.pending).unwrap(), WaitStep::Done(_)) {}
}

/// Allocations of building and running `text` for `dur_s` simulated
/// seconds (after the same warm-up), the build's excluded.
fn run_allocs(text: &str, dur_s: f64) -> u64 {
    let sets = vec![format!("duration_s={dur_s}")];
    let s = exitless::scenario::Scenario::parse(text, &sets).unwrap();
    let cal = exitless::calibration::Calibration::default_host();
    let mut w = exitless::world::World::build(&s, &cal).unwrap();
    let before = allocs();
    w.run(|_| {});
    allocs() - before
}

/// In the world, a vCanal run's event loop (libCanal in the guest, the
/// service core, the host stack, the client host, the completion
/// interrupts; netperf's calls and the HTTP server's) allocates no more in a run four times as long: nothing on
/// its per-call path allocates, only what grows once at the start.
#[test]
fn the_world_path_allocates_nothing_per_call() {
    for test in [
        "[workload.netperf]\ntest = \"udp-rr\"\nmsg_bytes = 1",
        "[workload.netperf]\ntest = \"tcp-stream\"\nmsg_bytes = 16384",
        // The HTTP server: accept, epoll_ctl, epoll_wait, recv, send.
        "[workload.nginx]\nworkers = 2\nab_processes = 2\nconcurrency = 4\npage_bytes = 4096",
    ] {
        let text = format!(
            "scheme = \"kvm\"\nseed = 1\nwarmup_s = 0.005\n[machine]\ncores = 4\n\
             [guest]\ntick = \"off\"\n[background]\nenabled = false\n\
             {test}\n[workload.vcanal]\n"
        );
        let short = run_allocs(&text, 0.01);
        let long = run_allocs(&text, 0.04);
        assert!(
            long <= short + 16,
            "{test}: {short} allocations in 10 ms, {long} in 40 ms"
        );
    }
}
