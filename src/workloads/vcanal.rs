//! netperf over vCanal sockets (vcanal.md §4): the in-guest side of
//! TCP_STREAM (the VM sends) and UDP_RR (the VM as client or as server),
//! written against libCanal instead of the guest kernel's socket layer.
//!
//! libCanal is a user-level library (vcanal.md §2.1), so it lives in the
//! program: each socket call is built into an INR in the channel pages the
//! process shares with the host (`Sys::shared`) and enqueued without an
//! exit; the program then polls the INR's state (one `completion_poll` per
//! poll), and once the poll budget is spent it asks the helper driver for
//! interrupt mode (an ioctl, one system call) and sleeps on the driver's
//! wait queue (`TaskStep::WaitDriver`) until the completion interrupt.

use crate::engine::{LatencyHistogram, Time};
use crate::guest::app::{insert_percentiles_us, App, LatencyFamily, Metrics, Sys, TaskStep};
use crate::guest::libcanal::inr::{Buf, Call, SockAddr, SockType};
use crate::guest::libcanal::radix::PAGE_SIZE;
use crate::guest::libcanal::{Completion, LibCanal, Pending, SubmitError, WaitStep};
use crate::hv::vcanal::VcanalCosts;
use crate::hw::guest_memory::GuestMemory;

/// Where the program's send and receive buffer lies in its address space
/// (one buffer, reused by every call, as netperf's is).
pub const BUF_GVA: u64 = 0x7f00_0000_0000;

/// The GPA the guest's page tables map [`BUF_GVA`] to (inside guest RAM,
/// away from the channel pages). The helper driver's walk of a page
/// (vcanal.md §2.6 step 1) returns `BUF_GPA + (gva - BUF_GVA)`.
pub const BUF_GPA: u64 = 0x0100_0000;

/// The client host's address and the netperf data port (netperf's
/// netserver answers on a port it chooses; any fixed one will do).
pub const PEER: SockAddr = SockAddr {
    ip: 0x0a00_0002,
    port: 12865,
};

/// The port a UDP_RR server in the VM binds.
pub const RR_PORT: u16 = 12866;

/// The guest's page walk for the program's buffer (the helper driver's
/// GVA → GPA, vcanal.md §2.6): None outside it.
pub fn walk(gva_page: u64) -> Option<u64> {
    let off = gva_page.checked_sub(BUF_GVA)?;
    (off < 1 << 24).then_some(BUF_GPA + off)
}

/// The guest-side costs of a libCanal call.
#[derive(Clone, Copy, Debug)]
pub struct CanalAppCosts {
    /// vCanal's primitive costs.
    pub canal: VcanalCosts,
    /// A system call (the ioctl that arms interrupt mode).
    pub syscall: Time,
    /// The hybrid address space is on (vcanal.md §2.6); off, the cache is
    /// emptied before each call, so every buffer page is walked.
    pub hybrid: bool,
    /// Ring the helper driver's doorbell after each enqueue ("w/o
    /// Polling", vcanal.md §3).
    pub kick: bool,
    /// One failed poll of the wait loop (§2.5): the poll itself, and under
    /// the `yield` reading a `sched_yield()` system call.
    pub spin: Time,
}

impl CanalAppCosts {
    /// The costs a VM's libCanal runs with under `spec`.
    pub fn new(canal: VcanalCosts, syscall: Time, spec: &crate::scenario::VcanalSpec) -> Self {
        Self {
            canal,
            syscall,
            hybrid: spec.hybrid_address_space,
            kick: spec.kick,
            spin: spin_iteration(&canal, syscall, spec.spin),
        }
    }
}

/// One failed iteration of libCanal's wait loop (§2.5) under reading
/// `spin`: a poll that hits and a PAUSE, plus, under `yield`, the system
/// call into `sched_yield()` that finds nothing else to run.
pub fn spin_iteration(
    canal: &VcanalCosts,
    syscall: Time,
    spin: crate::scenario::VcanalSpin,
) -> Time {
    match spin {
        crate::scenario::VcanalSpin::Pause => canal.spin_poll,
        crate::scenario::VcanalSpin::Yield => canal.spin_poll + syscall + canal.sched_yield,
    }
}

/// What the program does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CanalTest {
    /// TCP_STREAM, the VM sending `msg` bytes per send().
    TcpStreamSend,
    /// UDP_RR with the VM as the client.
    UdpRrClient,
    /// UDP_RR with the VM as the server.
    UdpRrServer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Socket,
    Connect,
    Bind,
    Send,
    SendTo,
    RecvFrom,
}

/// One thread's calls through libCanal (vcanal.md §2.1): the call in
/// flight, the doorbell still to ring for it, and the counts every
/// libCanal program reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct CanalCaller {
    pending: Option<Pending>,
    kick_due: bool,
    /// Calls enqueued.
    pub calls: u64,
    /// Looks at a pending INR's flag that found it still running.
    pub polls: u64,
    /// Waits that went to sleep in the helper driver.
    pub sleeps: u64,
    /// Radix-cache misses (helper-driver page walks).
    pub misses: u64,
}

/// What a thread does about its call in flight.
pub enum CallWait {
    /// No call in flight: go on with the program.
    Idle,
    /// The call completed with this result.
    Done(Completion),
    /// Not yet: this step first (the doorbell, a spin, arming the
    /// interrupt, sleeping).
    Step(TaskStep),
}

impl CanalCaller {
    /// Rings the doorbell for the call just enqueued, or looks once more
    /// at the call in flight: spin up to the poll count, then switch to
    /// interrupt mode through the helper driver and sleep (§2.1).
    pub fn wait(
        &mut self,
        lib: &mut LibCanal,
        mem: &mut GuestMemory,
        costs: &CanalAppCosts,
    ) -> CallWait {
        if std::mem::take(&mut self.kick_due) {
            return CallWait::Step(TaskStep::DriverKick);
        }
        let Some(mut p) = self.pending else {
            return CallWait::Idle;
        };
        let step = match lib.wait(mem, &mut p) {
            Ok(WaitStep::Done(done)) => {
                self.pending = None;
                return CallWait::Done(done);
            }
            // The INR's line is unchanged until the service writes the
            // answer: a failed poll hits in the waiter's cache. (The poll
            // that sees the answer takes the line back from the service
            // core, one cache-to-cache transfer, not charged.) Under the
            // `yield` reading the iteration also calls sched_yield(); the
            // thread is alone on its vCPU in every run the paper compares,
            // so the yield returns to it (named in docs/vcanal.md).
            Ok(WaitStep::Spin) => {
                self.polls += 1;
                TaskStep::Compute(costs.spin)
            }
            // The ioctl into the helper driver; the next step re-checks
            // before sleeping.
            Ok(WaitStep::ArmInterrupt) => TaskStep::Compute(costs.syscall),
            Ok(WaitStep::Sleep) => {
                self.sleeps += 1;
                TaskStep::WaitDriver
            }
            Err(_) => return CallWait::Step(TaskStep::Exit),
        };
        self.pending = Some(p);
        CallWait::Step(step)
    }

    /// Encodes `call` as an INR and enqueues it, with no exit; without the
    /// hybrid address space every call walks its pages afresh.
    pub fn submit(
        &mut self,
        lib: &mut LibCanal,
        mem: &mut GuestMemory,
        call: Call<i32>,
        walk: impl FnMut(u64) -> Option<u64>,
        costs: &CanalAppCosts,
    ) -> TaskStep {
        if !costs.hybrid {
            lib.cache.flush();
        }
        match lib.submit(mem, call, walk) {
            Ok(s) => {
                self.pending = Some(s.pending);
                self.kick_due = costs.kick;
                self.calls += 1;
                self.misses += u64::from(s.misses);
                TaskStep::Compute(costs.canal.submit(s.hits, s.misses))
            }
            // §7: a full ring or pool: the enqueuer spins and retries.
            Err(SubmitError::RingFull) | Err(SubmitError::NoInr) => {
                TaskStep::Compute(costs.canal.completion_poll)
            }
            Err(_) => TaskStep::Exit,
        }
    }

    /// Zeroes the counts (end of the warm-up).
    pub fn reset_counts(&mut self) {
        *self = CanalCaller {
            pending: self.pending,
            kick_due: self.kick_due,
            ..CanalCaller::default()
        };
    }
}

/// netperf's in-guest side over libCanal.
pub struct CanalNetperf {
    lib: LibCanal,
    test: CanalTest,
    msg: u32,
    costs: CanalAppCosts,
    fd: i32,
    next: Step,
    caller: CanalCaller,
    /// The UDP_RR client's request time.
    sent_at: Time,
    /// Where the server's reply goes (the requester).
    reply_to: SockAddr,
    rtt: LatencyHistogram,
    transactions: u64,
    bytes: u64,
    errors: u64,
}

impl CanalNetperf {
    /// The program over `lib` (its VM's channel, announced at boot).
    pub fn new(lib: LibCanal, test: CanalTest, msg: u32, costs: CanalAppCosts) -> Self {
        CanalNetperf {
            lib,
            test,
            msg,
            costs,
            fd: -1,
            next: Step::Socket,
            caller: CanalCaller::default(),
            sent_at: 0,
            reply_to: PEER,
            rtt: LatencyHistogram::new(),
            transactions: 0,
            bytes: 0,
            errors: 0,
        }
    }

    fn buf(&self) -> Buf {
        Buf {
            addr: BUF_GVA,
            len: u64::from(self.msg),
        }
    }

    /// The call the program makes next.
    fn call(&self) -> Call<i32> {
        let fd = self.fd;
        match self.next {
            Step::Socket => Call::Socket {
                ty: match self.test {
                    CanalTest::TcpStreamSend => SockType::Stream,
                    _ => SockType::Dgram,
                },
                protocol: 0,
            },
            Step::Connect => Call::Connect { fd, addr: PEER },
            Step::Bind => Call::Bind {
                fd,
                addr: SockAddr {
                    ip: 0,
                    port: RR_PORT,
                },
            },
            Step::Send => Call::Send {
                fd,
                buf: self.buf(),
                flags: 0,
            },
            Step::SendTo => Call::SendTo {
                fd,
                buf: self.buf(),
                flags: 0,
                addr: self.reply_to,
            },
            Step::RecvFrom => Call::RecvFrom {
                fd,
                buf: Buf {
                    addr: BUF_GVA,
                    len: PAGE_SIZE,
                },
                flags: 0,
            },
        }
    }

    /// A call finished at `now`: what comes next.
    fn done(&mut self, c: Completion, now: Time) {
        let ret = match c.ret {
            Ok(v) => v,
            Err(_) => {
                // A failed call is retried (the host stack refused it,
                // e.g. EAGAIN); counted so a broken path shows.
                self.errors += 1;
                return;
            }
        };
        self.next = match (self.test, self.next) {
            (_, Step::Socket) => {
                self.fd = ret as i32;
                match self.test {
                    CanalTest::TcpStreamSend => Step::Connect,
                    CanalTest::UdpRrClient => Step::SendTo,
                    CanalTest::UdpRrServer => Step::Bind,
                }
            }
            (_, Step::Connect) => Step::Send,
            (_, Step::Bind) => Step::RecvFrom,
            (_, Step::Send) => {
                self.bytes += ret as u64;
                Step::Send
            }
            (_, Step::SendTo) => Step::RecvFrom,
            (CanalTest::UdpRrClient, Step::RecvFrom) => {
                self.transactions += 1;
                self.rtt.record(now.saturating_sub(self.sent_at));
                Step::SendTo
            }
            (_, Step::RecvFrom) => {
                if let Some(p) = c.peer {
                    self.reply_to = p;
                }
                self.transactions += 1;
                Step::SendTo
            }
        };
    }
}

impl App for CanalNetperf {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let now = sys.now;
        let Some(mem) = sys.shared.as_deref_mut() else {
            // No channel: AF_VSOCKET is not available.
            return TaskStep::Exit;
        };
        match self.caller.wait(&mut self.lib, mem, &self.costs) {
            CallWait::Done(done) => self.done(done, now),
            CallWait::Step(step) => return step,
            CallWait::Idle => {}
        }
        if self.next == Step::SendTo && self.test == CanalTest::UdpRrClient {
            self.sent_at = now;
        }
        let call = self.call();
        self.caller
            .submit(&mut self.lib, mem, call, walk, &self.costs)
    }

    fn reset_metrics(&mut self) {
        self.rtt = LatencyHistogram::new();
        self.transactions = 0;
        self.bytes = 0;
        self.caller.reset_counts();
        self.errors = 0;
    }

    fn latencies<'a>(&'a self, out: &mut Vec<LatencyFamily<'a>>) {
        if matches!(self.test, CanalTest::UdpRrClient) && self.rtt.count() > 0 {
            out.push(
                LatencyFamily::us("udp_rr.latency", &self.rtt).with_mean_us("udp_rr.latency_us"),
            );
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("vcanal.calls".into(), self.caller.calls as f64);
        out.insert("vcanal.polls".into(), self.caller.polls as f64);
        out.insert("vcanal.sleeps".into(), self.caller.sleeps as f64);
        out.insert("vcanal.page_walks".into(), self.caller.misses as f64);
        out.insert("vcanal.call_errors".into(), self.errors as f64);
        out.insert("vcanal.bytes_sent".into(), self.bytes as f64);
        match self.test {
            CanalTest::TcpStreamSend => {
                out.insert("netperf.messages_sent".into(), self.caller.calls as f64);
            }
            CanalTest::UdpRrClient => {
                out.insert("udp_rr.transactions".into(), self.transactions as f64);
                if self.rtt.count() > 0 {
                    out.insert("udp_rr.latency_us".into(), self.rtt.mean_us());
                    insert_percentiles_us(out, "udp_rr.latency", &self.rtt);
                }
            }
            CanalTest::UdpRrServer => {
                out.insert("udp_rr.served".into(), self.transactions as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::VcanalSpin;

    fn canal() -> VcanalCosts {
        VcanalCosts {
            inr_build: 0,
            enqueue: 0,
            completion_poll: 40,
            spin_poll: 6,
            sched_yield: 250,
            radix_lookup: 0,
            page_walk: 0,
            dequeue: 0,
            service_per_call: 0,
            port_translation: 0,
            completion_write: 0,
            idle_poll_round: 0,
        }
    }

    /// A paused iteration is the poll alone; a yielding one adds the
    /// system call's entry and exit and the scheduler's yield.
    #[test]
    fn a_wait_iteration_costs_what_its_reading_does() {
        let c = canal();
        assert_eq!(spin_iteration(&c, 200, VcanalSpin::Pause), 6);
        assert_eq!(spin_iteration(&c, 200, VcanalSpin::Yield), 6 + 200 + 250);
    }
}
