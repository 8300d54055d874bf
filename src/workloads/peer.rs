//! A peer host process: the other end of a guest's TCP connection, either a
//! process on the VM's host reached through the bridge and vhost (DID's PV
//! configurations) or the load generator behind the 10 GbE link (the SR-IOV
//! configurations). Its kernel stack and the process share one CPU, served
//! in arrival order: each received segment, each sent segment and each
//! wake-up of the process costs calibrated time, and a frame leaves only
//! when the CPU reaches it.

use crate::engine::Time;
use crate::guest::app::Metrics;
use crate::guest::tcp::Tcp;
use crate::hw::wire::{Frame, Transport};

/// Costs of the peer's stack (from the calibration file).
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerCosts {
    /// Receive path per segment (driver/bridge, IP, TCP).
    pub rx_segment: Time,
    /// Transmit path per segment (TCP, IP, device).
    pub tx_segment: Time,
    /// Waking the blocked process and switching to it.
    pub wakeup: Time,
}

/// What a peer application does when its connection changes.
pub trait PeerApp {
    /// Called at start, when data or acknowledgements arrive, and at the
    /// time it last asked for. Reads and writes through `tcp`; returns the
    /// CPU time it used and when it wants to be called again, if ever.
    fn poll(&mut self, tcp: &mut Tcp, now: Time) -> (Time, Option<Time>);
    /// The warm-up is over.
    fn reset_metrics(&mut self);
    /// Adds its metrics.
    fn metrics(&self, out: &mut Metrics);
}

/// One peer process with one connection.
pub struct PeerHost {
    /// The connection.
    pub tcp: Tcp,
    /// Its flow id (as the guest's socket knows it).
    pub flow: u16,
    app: Box<dyn PeerApp>,
    costs: PeerCosts,
    busy_until: Time,
    app_timer: Option<Time>,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames received.
    pub frames_in: u64,
}

impl PeerHost {
    /// A peer running `app` on connection `flow`.
    pub fn new(tcp: Tcp, flow: u16, app: Box<dyn PeerApp>, costs: PeerCosts) -> Self {
        PeerHost {
            tcp,
            flow,
            app,
            costs,
            busy_until: 0,
            app_timer: Some(0),
            frames_out: 0,
            frames_in: 0,
        }
    }

    /// The earliest time the peer must run without a frame arriving (its
    /// application's or its TCP's timer).
    pub fn next_timer(&self) -> Option<Time> {
        match (self.app_timer, self.tcp.next_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A frame reached the peer at `now`. Frames it sends in response are
    /// appended to `out` with the time each leaves.
    pub fn receive(&mut self, f: Frame, now: Time, out: &mut Vec<(Time, Frame)>) {
        let Transport::Tcp(seg) = f.transport else {
            return;
        };
        if f.flow != self.flow {
            return;
        }
        self.frames_in += 1;
        let idle = self.busy_until <= now;
        let mut t = self.busy_until.max(now) + self.costs.rx_segment;
        self.tcp.on_segment(seg, t);
        if self.tcp.readable() > 0 && idle {
            t += self.costs.wakeup;
        }
        self.busy_until = t;
        self.run_app(out);
    }

    /// A timer of the peer came due at `now`.
    pub fn timer(&mut self, now: Time, out: &mut Vec<(Time, Frame)>) {
        let t = self.busy_until.max(now);
        self.busy_until = t;
        if self.tcp.next_timer().is_some_and(|d| d <= now) {
            self.tcp.on_timer(now);
        }
        if self.app_timer.is_some_and(|d| d <= now) {
            self.app_timer = None;
        }
        self.run_app(out);
    }

    fn run_app(&mut self, out: &mut Vec<(Time, Frame)>) {
        let (cost, wake) = self.app.poll(&mut self.tcp, self.busy_until);
        self.busy_until += cost;
        if wake.is_some() {
            self.app_timer = wake;
        }
        while let Some(seg) = self.tcp.poll_output(self.busy_until) {
            self.busy_until += self.costs.tx_segment;
            self.frames_out += 1;
            out.push((self.busy_until, Frame::tcp(self.flow, seg, self.busy_until)));
        }
    }

    /// The warm-up is over.
    pub fn reset_metrics(&mut self) {
        self.app.reset_metrics();
    }

    /// Adds the application's metrics.
    pub fn metrics(&self, out: &mut Metrics) {
        self.app.metrics(out);
    }
}
