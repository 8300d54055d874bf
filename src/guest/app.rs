//! The interface between the guest kernel and the programs it runs.
//! Workloads implement [`App`]; the kernel schedules them as tasks.

use crate::engine::Time;
use std::collections::BTreeMap;

/// What a task asks of the kernel after each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStep {
    /// Run on the CPU for this long (preemptible by interrupts).
    Compute(Time),
    /// Block until woken (by data arriving on its socket).
    Block,
    /// Sleep on the wait queue of the kernel's wait-queue driver until its
    /// interrupt wakes the task (vCanal's helper driver in interrupt mode,
    /// vcanal.md §2.5).
    WaitDriver,
    /// Ring the wait-queue driver's doorbell (an ioctl that writes its I/O
    /// port: vCanal's request notification without polling, vcanal.md
    /// §3 "w/o Polling"), then go on.
    DriverKick,
    /// The kernel's driver, inside the task's system call, notifies a
    /// device queue: a write of `value` to the queue's notify `port`
    /// (virtio's QUEUE_NOTIFY, as `virtqueue_notify` does), then the task
    /// goes on (virtio-vsock's send path, `virtio_transport_send_pkt_work`).
    Notify {
        /// The notify port.
        port: u16,
        /// The value written (the queue index).
        value: u32,
    },
    /// `clock_nanosleep(TIMER_ABSTIME)` until this time.
    SleepUntil(Time),
    /// `epoll_wait` with a timeout: block until data arrives on the task's
    /// socket or until this time, whichever comes first.
    WaitUntil(Time),
    /// A privileged operation of a program that runs as the kernel (a
    /// kvm-unit-tests test at CPL 0): the platform executes it, then the
    /// task goes on.
    Kernel(super::KernelOp),
    /// `cli`: RFLAGS.IF := 0.
    Cli,
    /// `sti`: RFLAGS.IF := 1 (the hardware looks at pending interrupts
    /// before the next step).
    Sti,
    /// `sti; hlt` (`safe_halt`): the HLT executes in the STI's interrupt
    /// shadow, so an interrupt already pending is taken only after it.
    SafeHalt,
    /// Busy-wait on memory (`while (!x) barrier();`): the CPU spins until
    /// an interrupt, or another CPU's store the program waits for, makes
    /// it look again.
    Spin,
    /// The task is finished.
    Exit,
}

/// A datagram as a socket holds it (received) or a program hands it to
/// `sendto` (sent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Datagram {
    /// The flow (peer address and port) it came from or goes to.
    pub flow: u16,
    /// Payload bytes.
    pub len: u32,
    /// What the program reads of the payload: a sender's counter, or an
    /// application's message identity (see [`crate::hw::wire::Transport`]).
    pub seq: u64,
    /// When the sender's stack took it.
    pub sent: Time,
}

impl Datagram {
    /// The datagram a UDP frame carries, or an ICMP echo reply as a raw
    /// ICMP socket (ping's) reads it; None for other frames.
    pub fn of(f: &crate::hw::wire::Frame) -> Option<Self> {
        match f.transport {
            crate::hw::wire::Transport::Udp { len, seq }
            | crate::hw::wire::Transport::Icmp {
                request: false,
                len,
                seq,
            } => Some(Datagram {
                flow: f.flow,
                len,
                seq,
                sent: f.sent,
            }),
            crate::hw::wire::Transport::Tcp(_) | crate::hw::wire::Transport::Icmp { .. } => None,
        }
    }

    /// The frame that carries it.
    pub fn frame(&self) -> crate::hw::wire::Frame {
        crate::hw::wire::Frame::udp(self.flow, self.len, self.seq, self.sent)
    }
}

/// Datagrams a UDP socket's send buffer holds before `sendto` fails
/// (Linux `wmem_default` 208 KiB over ~1 KiB messages and their skbs).
pub const UDP_SNDBUF_DATAGRAMS: usize = 256;

/// Kernel services a task may use during a step.
pub struct Sys<'a> {
    /// Current time (the task's clock_gettime).
    pub now: Time,
    /// The task's UDP socket receive queue, if it has one.
    pub socket: Option<&'a mut std::collections::VecDeque<Datagram>>,
    /// The task's connected TCP socket, if it has one.
    pub tcp: Option<&'a mut super::tcp::Tcp>,
    /// Every TCP socket, for a task that serves many connections (it uses
    /// those whose `task` is itself).
    pub conns: Option<Conns<'a, super::net::TcpSock>>,
    /// The task's block queue, if it does block I/O.
    pub blk: Option<&'a mut super::blk::BlkQueue>,
    /// Datagrams the task sent with `sendto` and the stack has not yet
    /// taken (present when the task has a UDP socket).
    pub udp_tx: Option<&'a mut std::collections::VecDeque<Datagram>>,
    /// Guest memory the process shares with a host service (vCanal's
    /// channel pages, mapped by libCanal; vcanal.md §2.1), if any.
    pub shared: Option<&'a mut crate::hw::guest_memory::GuestMemory>,
    /// The VM's virtio-vsock device as its kernel driver sees it (the
    /// rings), for a task whose socket is `AF_VSOCK`, if any.
    pub vsock: Option<&'a mut crate::hw::virtio_vsock::VirtioVsockDev>,
}

impl Sys<'_> {
    /// recv(): pops one datagram if the socket holds one.
    pub fn recv(&mut self) -> Option<Datagram> {
        self.socket.as_mut().and_then(|s| s.pop_front())
    }

    /// sendto() on the UDP socket: queues `d` (its `sent` is set to now)
    /// for the transmit path. False if the task has no UDP socket or its
    /// send buffer is full (the datagram is dropped, as with `EAGAIN`).
    pub fn udp_send(&mut self, mut d: Datagram) -> bool {
        let now = self.now;
        match self.udp_tx.as_mut() {
            Some(q) if q.len() < UDP_SNDBUF_DATAGRAMS => {
                d.sent = now;
                q.push_back(d);
                true
            }
            _ => false,
        }
    }

    /// Bytes the TCP socket can return to recv() now.
    pub fn tcp_readable(&self) -> u32 {
        self.tcp.as_ref().map_or(0, |t| t.readable())
    }

    /// recv() on the TCP socket: up to `max` bytes.
    pub fn tcp_recv(&mut self, max: u32) -> u32 {
        self.tcp.as_mut().map_or(0, |t| t.recv(max))
    }

    /// send() on the TCP socket: bytes accepted into the send buffer.
    pub fn tcp_send(&mut self, bytes: u32) -> u32 {
        self.tcp.as_mut().map_or(0, |t| t.send(bytes))
    }
}

/// A program's view of many connections (an epoll set): reading is free,
/// and each connection it takes for writing or receiving is noted, so the
/// stack only services (output, timers) the connections that changed. The
/// ready list names, in ascending order, the connections that received
/// since the program last looked (what an edge-triggered `epoll_wait`
/// returns); a program need not look at the others.
pub struct Conns<'a, T> {
    items: &'a mut [T],
    touched: &'a mut Vec<usize>,
    seen: &'a mut [bool],
    ready: &'a [usize],
}

impl<'a, T> Conns<'a, T> {
    /// A view of `items`; `touched` and `seen` (same length as `items`)
    /// collect the connections taken with [`get`](Self::get).
    pub fn new(items: &'a mut [T], touched: &'a mut Vec<usize>, seen: &'a mut [bool]) -> Self {
        Conns {
            items,
            touched,
            seen,
            ready: &[],
        }
    }

    /// The same view with a ready list (ascending connection indices).
    pub fn with_ready(mut self, ready: &'a [usize]) -> Self {
        debug_assert!(ready.windows(2).all(|w| w[0] < w[1]));
        self.ready = ready;
        self
    }

    /// The connections that received since the program last looked.
    pub fn ready(&self) -> &'a [usize] {
        self.ready
    }

    /// Number of connections.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Connection `i`, to look at.
    pub fn peek(&self, i: usize) -> &T {
        &self.items[i]
    }

    /// Connection `i`, to act on (noted as touched).
    pub fn get(&mut self, i: usize) -> &mut T {
        if !self.seen[i] {
            self.seen[i] = true;
            self.touched.push(i);
        }
        &mut self.items[i]
    }
}

/// Metrics a program reports at the end of a run, by name.
pub type Metrics = BTreeMap<String, f64>;

/// Adds a latency distribution's percentile curve for latency plots:
/// `{prefix}_p50_us`, `_p90_us`, `_p99_us` and `_p999_us` (p99.9).
pub fn insert_percentiles_us(
    out: &mut Metrics,
    prefix: &str,
    hist: &crate::engine::LatencyHistogram,
) {
    LatencyFamily::us(prefix, hist).insert(out);
}

/// A latency distribution a program reports percentiles of, with the
/// metric each percentile is reported under. A run of several VMs merges
/// each family's histograms over the VMs into `all.<metric>`: percentiles
/// over every VM's samples, never a mean of percentiles.
pub struct LatencyFamily<'a> {
    /// The distribution.
    pub hist: &'a crate::engine::LatencyHistogram,
    /// (metric name, percentile 0..=100, picoseconds per reported unit).
    pub metrics: Vec<(String, f64, crate::engine::Time)>,
    /// The metric the program reports the distribution's mean under, and
    /// its unit (ps): merged, a mean over every sample.
    pub mean: Option<(String, crate::engine::Time)>,
}

impl<'a> LatencyFamily<'a> {
    /// The curve [`insert_percentiles_us`] reports: `{prefix}_p50_us` ..
    /// `{prefix}_p999_us`.
    pub fn us(prefix: &str, hist: &'a crate::engine::LatencyHistogram) -> Self {
        let metrics = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)]
            .into_iter()
            .map(|(name, p)| (format!("{prefix}_{name}_us"), p, crate::engine::US))
            .collect();
        LatencyFamily {
            hist,
            metrics,
            mean: None,
        }
    }

    /// Names the metric its mean is reported under, in µs.
    pub fn with_mean_us(mut self, name: &str) -> Self {
        self.mean = Some((name.to_string(), crate::engine::US));
        self
    }

    /// Its percentile metrics' values.
    pub fn insert(&self, out: &mut Metrics) {
        for (name, p, unit) in &self.metrics {
            out.insert(name.clone(), self.hist.percentile_in(*p, *unit));
        }
    }

    /// Its percentiles and mean over `merged` (its own samples and other
    /// VMs'), as `{prefix}<metric>`.
    pub fn insert_merged(
        &self,
        out: &mut Metrics,
        merged: &crate::engine::LatencyHistogram,
        prefix: &str,
    ) {
        for (name, p, unit) in &self.metrics {
            out.insert(format!("{prefix}{name}"), merged.percentile_in(*p, *unit));
        }
        if let Some((name, unit)) = &self.mean {
            out.insert(
                format!("{prefix}{name}"),
                if merged.count() == 0 {
                    f64::NAN
                } else {
                    merged.mean() as f64 / *unit as f64
                },
            );
        }
    }
}

/// A program running as a task in the guest.
pub trait App {
    /// Called whenever the task runs and has nothing left to compute.
    fn step(&mut self, sys: &mut Sys) -> TaskStep;
    /// Called once the warm-up is over: drop what was measured so far.
    /// Whether its compute steps are per-operation costs that vary from
    /// one call to the next (the kernel's seeded cost variance applies to
    /// them). A fixed stretch of pure computation (WhileLoop's register
    /// loop, a CPU burner's slices) says no.
    fn varies(&self) -> bool {
        true
    }

    fn reset_metrics(&mut self) {}
    /// A program running as the kernel handles interrupt `vector` on CPU
    /// `cpu` at `now` (its handler, after the EOI that started at
    /// `eoi_at`). Returns whether it took it; a program waiting on
    /// another CPU is then made to look again. Default: not its vector.
    fn interrupt(&mut self, _cpu: usize, _vector: u8, _now: Time, _eoi_at: Time) -> bool {
        false
    }
    /// Adds this program's metrics to `out`.
    fn metrics(&self, out: &mut Metrics);
    /// The latency distributions behind its percentile metrics.
    fn latencies<'a>(&'a self, _out: &mut Vec<LatencyFamily<'a>>) {}
}
