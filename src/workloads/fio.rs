//! Fio (DID §5.6): one thread, 4 KB random reads and writes with direct
//! I/O at queue depth 1 on a virtio-blk disk backed by a host RAM disk.
//! Reported: IOPS and completion time (issue → returned to Fio).
//!
//! Each turn of fio's loop does its own user-space work first (account
//! the completed I/O, pick the next offset: `user_work`), then stamps the
//! new I/O's issue time and enters the kernel (`syscall`): the completion
//! time runs from that stamp, as fio's does.

use crate::engine::{LatencyHistogram, RngStream, Time, SEC};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};
use crate::hw::virtio_blk::BlkRequest;

/// The Fio job.
pub struct Fio {
    rng: RngStream,
    block: u32,
    read_fraction: f64,
    sectors: u64,
    user_work: Time,
    syscall: Time,
    inflight: bool,
    latency: LatencyHistogram,
    completed: u64,
    since: Option<Time>,
    last: Time,
}

impl Fio {
    /// A job of `block`-byte requests over a disk of `disk_bytes`, reads
    /// with probability `read_fraction`; each I/O costs fio `user_work` in
    /// user space before its system call's entry, `syscall`.
    pub fn new(
        seed: u64,
        block: u32,
        read_fraction: f64,
        disk_bytes: u64,
        user_work: Time,
        syscall: Time,
    ) -> Self {
        Fio {
            rng: RngStream::new(seed, "fio"),
            block,
            read_fraction,
            sectors: (disk_bytes / u64::from(block.max(512))).max(1),
            user_work,
            syscall,
            inflight: false,
            latency: LatencyHistogram::new(),
            completed: 0,
            since: None,
            last: 0,
        }
    }
}

impl App for Fio {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let now = sys.now;
        let Some(q) = sys.blk.as_mut() else {
            return TaskStep::Exit;
        };
        while let Some((r, _)) = q.done.pop_front() {
            self.latency.record(now.saturating_sub(r.issued));
            self.completed += 1;
            self.inflight = false;
            self.since.get_or_insert(now);
            self.last = now;
        }
        if self.inflight {
            return TaskStep::Block;
        }
        let block_index = (self.rng.uniform() * self.sectors as f64) as u64;
        q.submit.push_back(BlkRequest {
            write: self.rng.uniform() >= self.read_fraction,
            sector: block_index * u64::from(self.block) / 512,
            len: self.block,
            issued: now + self.user_work,
        });
        self.inflight = true;
        TaskStep::Compute(self.user_work + self.syscall)
    }

    fn reset_metrics(&mut self) {
        self.latency = LatencyHistogram::new();
        self.completed = 0;
        self.since = None;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        out.push(
            LatencyFamily::us("fio.completion", &self.latency).with_mean_us("fio.completion_us"),
        );
    }

    fn metrics(&self, out: &mut Metrics) {
        let iops = match self.since {
            Some(t0) if self.last > t0 => {
                (self.completed.saturating_sub(1)) as f64 / ((self.last - t0) as f64 / SEC as f64)
            }
            _ => 0.0,
        };
        out.insert("fio.iops".into(), iops);
        out.insert("fio.completion_us".into(), self.latency.mean_us());
        // The percentile curve (p50 .. p99.9), for latency plots.
        insert_percentiles_us(out, "fio.completion", &self.latency);
    }
}
