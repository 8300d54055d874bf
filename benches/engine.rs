//! Engine throughput: a hold loop on the event queue (pop one, schedule one
//! at a random future time) at several queue sizes, as in REFERENCES.md, and
//! a full-platform run of the DID 600 kpps scenario. Prints events/s.
//! Run with `cargo bench --bench engine`.

use exitless::calibration::Calibration;
use exitless::engine::{EventQueue, RngStream};
use exitless::scenario::Scenario;
use exitless::world::World;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Counts heap allocations, to show the event loop does not allocate.
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

fn hold(pending: usize, ops: u64) -> f64 {
    let mut q: EventQueue<u64> = EventQueue::with_capacity(pending + 1);
    let mut r = RngStream::new(1, "bench");
    for i in 0..pending {
        q.schedule(r.next_u64() % 1_000_000, i as u64);
    }
    let t0 = Instant::now();
    let mut sink = 0u64;
    for _ in 0..ops {
        let (t, e) = q.pop_until(u64::MAX).expect("queue never empties");
        sink = sink.wrapping_add(e);
        q.schedule(t + 1 + r.next_u64() % 1_000_000, e);
    }
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    ops as f64 / dt
}

/// The same hold loop on a plain `BinaryHeap<Reverse<(time, seq)>>`: the
/// floor the event queue is measured against (issue 25 item 5).
fn hold_plain(pending: usize, ops: u64) -> f64 {
    use std::cmp::Reverse;
    let mut q = std::collections::BinaryHeap::with_capacity(pending + 1);
    let mut r = RngStream::new(1, "bench");
    let mut seq = 0u64;
    for _ in 0..pending {
        seq += 1;
        q.push(Reverse((r.next_u64() % 1_000_000, seq)));
    }
    let t0 = Instant::now();
    let mut sink = 0u64;
    for _ in 0..ops {
        let Reverse((t, e)) = q.pop().expect("heap never empties");
        sink = sink.wrapping_add(e);
        seq += 1;
        q.push(Reverse((t + 1 + r.next_u64() % 1_000_000, seq)));
    }
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    ops as f64 / dt
}

fn main() {
    for pending in [8usize, 64, 330, 10_000, 1_000_000] {
        let ops = 5_000_000;
        println!(
            "hold loop, {pending:>9} pending: {:6.2} M events/s (plain BinaryHeap<Reverse<(u64, u64)>>: {:6.2})",
            hold(pending, ops) / 1e6,
            hold_plain(pending, ops) / 1e6
        );
    }
    let cal = Calibration::default_host();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/validation/did/");
    let runs: [(&str, &str, &[&str]); 7] = [
        (
            "did 600 kpps UDP",
            "fig4.toml",
            &["scheme=did", "rate_pps=600000"],
        ),
        (
            "kvm 600 kpps UDP",
            "fig4.toml",
            &["scheme=kvm", "rate_pps=600000"],
        ),
        ("pv-did netpipe", "netpipe.toml", &["scheme=did"]),
        ("pv iperf", "iperf.toml", &["scheme=kvm"]),
        (
            "sriov memcached 100K rps",
            "memcached.toml",
            &["scheme=kvm", "rate_rps=100000"],
        ),
        ("kvm fio", "fio.toml", &["scheme=kvm"]),
        (
            "pv-did sip 1000 cps",
            "sip.toml",
            &[
                "scheme=did",
                "net.device=virtio",
                "workload.sip.rate_cps=1000",
                "workload.sip.call_duration_s=0.2",
            ],
        ),
    ];
    for (label, file, sets) in runs {
        let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        sets.push("duration_s=1".into());
        let path = format!("{dir}{file}");
        let s = Scenario::load(std::path::Path::new(&path), &sets).expect("scenario loads");
        let mut w = World::build(&s, &cal).expect("builds");
        let a0 = ALLOCS.load(Ordering::Relaxed);
        let t0 = Instant::now();
        w.run(|_| {});
        let dt = t0.elapsed().as_secs_f64();
        let allocs = ALLOCS.load(Ordering::Relaxed) - a0;
        let sim = s.duration_s + s.warmup_s;
        println!(
            "platform, {label}: {:.0} events in {dt:.3} s = {:.2} M events/s; {:.3} s wall per simulated s; {allocs} heap allocations during the run",
            w.events() as f64,
            w.events() as f64 / dt / 1e6,
            dt / sim
        );
    }
}
