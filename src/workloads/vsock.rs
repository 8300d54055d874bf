//! netperf TCP_STREAM over an `AF_VSOCK` socket (docs/vcanal.md,
//! "virtio-vsock"): the VM sends `msg` bytes per `send()` to a listener
//! on the host (the relay, which copies the stream to the client host).
//!
//! The socket's transport is the guest kernel's virtio-vsock driver
//! ([`VsockDriver`]); the program calls it as its system calls do:
//! `connect()` queues the REQUEST and sleeps until the RESPONSE, `send()`
//! queues RW packets within the peer's credit and sleeps on the socket
//! while there is none (`vsock_stream_sendmsg` waits on `sk_sleep`). The
//! driver's completion work (`virtio_transport_rx_work` and `_tx_work`,
//! kworkers on the same vCPU in Linux) runs in the task's context before
//! each call, and the queue notifies it asks for are the task's
//! [`TaskStep::Notify`]s (an OUT to the device's notify port, which the
//! hypervisor's ioeventfd turns into the back end's kick).

use crate::engine::Time;
use crate::guest::app::{App, Metrics, Sys, TaskStep};
use crate::guest::vsock::{State, VsockDriver};

/// The device's notify ports as the driver writes them (queue 0 RX,
/// queue 1 TX, as virtio-net's two ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VsockPorts {
    /// RX queue notify.
    pub rx: u16,
    /// TX queue notify.
    pub tx: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Connect,
    Connecting,
    Streaming,
    /// The connection was reset (nobody listens): the program ends.
    Failed,
}

/// netperf's TCP_STREAM sender on a vsock socket.
pub struct VsockNetperf {
    drv: VsockDriver,
    ports: VsockPorts,
    msg: u32,
    syscall: Time,
    phase: Phase,
    /// The REQUEST, queued at connect().
    request: Option<crate::hw::virtio_vsock::Hdr>,
    /// Bytes of the current send() still to queue (0: none in progress).
    left: u32,
    kick_rx: bool,
    kick_tx: bool,
    sends: u64,
    bytes: u64,
    sleeps: u64,
}

impl VsockNetperf {
    /// The program over driver `drv` (probed, with `request` its
    /// connection's REQUEST), sending `msg` bytes per call.
    pub fn new(
        drv: VsockDriver,
        request: crate::hw::virtio_vsock::Hdr,
        ports: VsockPorts,
        msg: u32,
        syscall: Time,
    ) -> Self {
        VsockNetperf {
            drv,
            ports,
            msg: msg.max(1),
            syscall,
            phase: Phase::Connect,
            request: Some(request),
            left: 0,
            kick_rx: false,
            kick_tx: false,
            sends: 0,
            bytes: 0,
            sleeps: 0,
        }
    }

    /// The driver (its connection and counters).
    pub fn driver(&self) -> &VsockDriver {
        &self.drv
    }
}

impl App for VsockNetperf {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        // Notifications decided in the last step go out first.
        if std::mem::take(&mut self.kick_tx) {
            return TaskStep::Notify {
                port: self.ports.tx,
                value: 1,
            };
        }
        if std::mem::take(&mut self.kick_rx) {
            return TaskStep::Notify {
                port: self.ports.rx,
                value: 0,
            };
        }
        let Some(dev) = sys.vsock.as_deref_mut() else {
            return TaskStep::Exit;
        };
        let (mut cost, rx_kick, tx_kick) = self.drv.completion_work(dev);
        self.kick_rx |= rx_kick;
        self.kick_tx |= tx_kick;
        match self.phase {
            Phase::Connect => {
                cost += self.syscall + self.drv.costs.tx_pkt;
                if let Some(req) = self.request.take() {
                    self.kick_tx |= self.drv.queue_control(dev, req);
                }
                self.phase = Phase::Connecting;
                TaskStep::Compute(cost)
            }
            Phase::Connecting | Phase::Streaming if self.drv.conn.state == State::Closed => {
                self.phase = Phase::Failed;
                TaskStep::Exit
            }
            Phase::Connecting => {
                if self.drv.conn.state == State::Established {
                    self.phase = Phase::Streaming;
                    return TaskStep::Compute(cost.max(1));
                }
                self.wait(cost)
            }
            Phase::Streaming => {
                if self.left == 0 {
                    // A new send() call.
                    self.left = self.msg;
                    cost += self.syscall;
                }
                let p = self.drv.send(dev, self.left);
                self.left -= p.bytes;
                self.bytes += u64::from(p.bytes);
                self.kick_tx |= p.kick;
                cost += p.cost;
                if self.left == 0 {
                    self.sends += 1;
                }
                if p.blocked && self.left > 0 && !self.kick_tx && !self.kick_rx && cost == 0 {
                    // Nothing done and no credit: sleep on the socket.
                    self.sleeps += 1;
                    return TaskStep::WaitDriver;
                }
                TaskStep::Compute(cost.max(1))
            }
            Phase::Failed => TaskStep::Exit,
        }
    }

    fn reset_metrics(&mut self) {
        self.sends = 0;
        self.bytes = 0;
        self.sleeps = 0;
        self.drv.counters = Default::default();
    }

    fn metrics(&self, out: &mut Metrics) {
        let c = &self.drv.counters;
        out.insert("vsock.guest_sends".into(), self.sends as f64);
        out.insert("vsock.guest_bytes".into(), self.bytes as f64);
        out.insert("vsock.guest_sleeps".into(), self.sleeps as f64);
        out.insert("vsock.guest_kicks_tx".into(), c.kicks_tx as f64);
        out.insert("vsock.guest_kicks_rx".into(), c.kicks_rx as f64);
        out.insert("vsock.guest_credit_stalls".into(), c.credit_stalls as f64);
        out.insert("vsock.guest_rx_buffers".into(), c.rx_bufs as f64);
    }
}

impl VsockNetperf {
    /// Sleep on the socket unless there is CPU time to charge first (the
    /// next step looks again).
    fn wait(&mut self, cost: Time) -> TaskStep {
        if cost > 0 || self.kick_tx || self.kick_rx {
            return TaskStep::Compute(cost.max(1));
        }
        self.sleeps += 1;
        TaskStep::WaitDriver
    }
}
