//! SIP over UDP (DID §5.8): a back-to-back user agent (B2BUA) in the VM
//! between a SIPp-like client (UAC, on the load generator) and a SIPp-like
//! server (UAS, on the VM's host).
//!
//! One call, as the paper lists it (INVITE → auth → UAS → 180 → 200 OK):
//!
//! ```text
//! UAC              B2BUA              UAS
//!  |--INVITE-------->|                  |
//!  |<-----------407--|                  |   digest challenge
//!  |--ACK----------->|                  |
//!  |--INVITE+auth--->|                  |
//!  |<-----------100--|--INVITE--------->|
//!  |<-----------180--|<-------------180-|
//!  |<-----------200--|<-------------200-|   set-up latency ends here
//!  |--ACK----------->|--ACK------------>|
//!  |   ... call_duration ...            |
//!  |--BYE----------->|--BYE------------>|
//!  |<-----------200--|<-------------200-|
//! ```
//!
//! Over UDP an INVITE client transaction retransmits its request at T1,
//! 2·T1, 4·T1 ... until a response arrives (Timer A) and gives up after
//! 64·T1 (Timer B), RFC 3261 §17.1.1.2. Both the UAC and the B2BUA's
//! outgoing leg run these timers; nothing else is retransmitted in this
//! model (a lost 200 OK or BYE fails the call, counted).
//!
//! Datagrams carry no payload bytes: the message's identity (call number
//! and method or status) travels in the transport's `seq` field, and its
//! size is that of SIPp's built-in scenario messages.

use super::peer::{PeerApp, PeerIo};
use crate::engine::{as_s, Time, MS, SEC};
use crate::guest::app::{App, Datagram, Metrics, Sys, TaskStep};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// RFC 3261 T1, the round-trip estimate: Timer A's first interval.
pub const T1: Time = 500 * MS;
/// RFC 3261 Timer B: an INVITE transaction times out after 64·T1.
pub const TIMER_B: Time = 64 * T1;

/// A SIP message of the call flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// INVITE without credentials.
    Invite,
    /// INVITE with a Proxy-Authorization header.
    InviteAuth,
    /// ACK (for the 407 or the 200).
    Ack,
    /// BYE.
    Bye,
    /// 100 Trying.
    Trying,
    /// 180 Ringing.
    Ringing,
    /// 200 OK to the INVITE (with SDP).
    Ok,
    /// 407 Proxy Authentication Required.
    ProxyAuth,
    /// 200 OK to the BYE.
    ByeOk,
    /// RADIUS Access-Request (RFC 2865) from the B2BUA's radiusclient.
    AccessRequest,
    /// RADIUS Access-Accept.
    AccessAccept,
}

impl Msg {
    const ALL: [Msg; 11] = [
        Msg::Invite,
        Msg::InviteAuth,
        Msg::Ack,
        Msg::Bye,
        Msg::Trying,
        Msg::Ringing,
        Msg::Ok,
        Msg::ProxyAuth,
        Msg::ByeOk,
        Msg::AccessRequest,
        Msg::AccessAccept,
    ];

    /// UDP payload bytes: SIPp's built-in uac/uas messages (headers, and
    /// SDP in INVITE and 200), rounded; the auth INVITE adds the
    /// Proxy-Authorization header, the 407 its challenge.
    pub fn bytes(self) -> u32 {
        match self {
            Msg::Invite => 600,
            Msg::InviteAuth => 800,
            Msg::Ack => 350,
            Msg::Bye => 350,
            Msg::Trying => 300,
            Msg::Ringing => 350,
            Msg::Ok => 600,
            Msg::ProxyAuth => 450,
            Msg::ByeOk => 300,
            // User-Name, the digest attributes (RFC 5090), NAS address,
            // Calling/Called-Station-Id, Cisco AV pairs, the header.
            Msg::AccessRequest => 400,
            Msg::AccessAccept => 60,
        }
    }

    fn code(self) -> u64 {
        Msg::ALL.iter().position(|&m| m == self).unwrap_or(0) as u64 + 1
    }

    /// The datagram's `seq` for message `self` of call `call`.
    pub fn encode(self, call: u32) -> u64 {
        (u64::from(call) << 8) | self.code()
    }

    /// The call and message a datagram's `seq` carries.
    pub fn decode(seq: u64) -> Option<(u32, Msg)> {
        let code = (seq & 0xff) as usize;
        let call = u32::try_from(seq >> 8).ok()?;
        code.checked_sub(1)
            .and_then(|i| Msg::ALL.get(i))
            .map(|&m| (call, m))
    }

    fn datagram(self, call: u32, flow: u16) -> Datagram {
        Datagram {
            flow,
            len: self.bytes(),
            seq: self.encode(call),
            sent: 0,
        }
    }
}

/// An INVITE client transaction's retransmission state (Timer A and B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InviteTimer {
    /// Next retransmission, while no response has come.
    next: Option<Time>,
    interval: Time,
    give_up: Time,
}

impl InviteTimer {
    fn start(now: Time) -> Self {
        InviteTimer {
            next: Some(now + T1),
            interval: T1,
            give_up: now + TIMER_B,
        }
    }

    /// Timer A fired at `now`: true to retransmit (and re-arm), false when
    /// Timer B has expired (the transaction failed).
    fn fire(&mut self, now: Time) -> bool {
        if now >= self.give_up {
            self.next = None;
            return false;
        }
        self.interval *= 2;
        self.next = Some(now + self.interval);
        true
    }
}

/// Timers keyed by call, earliest first; stale entries (the call's timer
/// moved or stopped) are skipped when they come up.
#[derive(Default)]
struct TimerHeap(BinaryHeap<Reverse<(Time, u32)>>);

impl TimerHeap {
    fn with_capacity(n: usize) -> Self {
        TimerHeap(BinaryHeap::with_capacity(n))
    }
    fn push(&mut self, t: Time, call: u32) {
        self.0.push(Reverse((t, call)));
    }
    fn peek(&self) -> Option<Time> {
        self.0.peek().map(|r| r.0 .0)
    }
    /// The next entry due by `now`.
    fn pop_due(&mut self, now: Time) -> Option<(Time, u32)> {
        if self.peek()? <= now {
            self.0.pop().map(|r| r.0)
        } else {
            None
        }
    }
}

// ---------------------------------------------------------------- B2BUA --

/// CPU costs of the B2BUA in the guest.
#[derive(Clone, Copy, Debug)]
pub struct B2buaCosts {
    /// Parse, transaction/dialog lookup and response building, per message.
    pub message: Time,
    /// Building the authentication request of a credentialed INVITE (the
    /// digest attributes from its Proxy-Authorization header).
    pub auth: Time,
    /// A `recvfrom`/`sendto` system call.
    pub syscall: Time,
    /// Handing an authentication to a radiusclient process and its sending
    /// the Access-Request (Sippy's `External_command`: the reactor queues
    /// the work item and notifies a worker thread, which writes the
    /// attributes to the process's stdin; the process builds the packet).
    pub radius_request: Time,
    /// The answer's way back: the radiusclient process woken by the
    /// Access-Accept decodes it and writes the result to its stdout, the
    /// worker thread reads it and wakes the reactor (`callFromThread`).
    pub radius_reply: Time,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Leg {
    /// No INVITE seen yet.
    #[default]
    Idle,
    /// 407 sent to the UAC.
    Challenged,
    /// Credentials handed to a radiusclient process; waiting for the
    /// RADIUS server's answer.
    Authorizing,
    /// 100 sent to the UAC, INVITE sent to the UAS.
    Proceeding,
    /// 180 relayed.
    Ringing,
    /// 200 relayed to the UAC.
    Answered,
    /// ACK relayed to the UAS.
    Confirmed,
    /// BYE relayed to the UAS.
    Closing,
    /// 200 to the BYE relayed.
    Done,
    /// The outgoing INVITE timed out.
    Failed,
}

#[derive(Clone, Copy, Debug, Default)]
struct B2bCall {
    leg: Leg,
    invite: InviteTimer,
}

/// The B2BUA: one task, one UDP socket, both legs of every call.
pub struct SipB2bua {
    /// Flow to and from the UAC.
    uac_flow: u16,
    /// Flow to and from the UAS.
    uas_flow: u16,
    /// Flow to and from the RADIUS server, when authentication goes
    /// through RADIUS (Sippy with `radiusclient`).
    radius_flow: Option<u16>,
    costs: B2buaCosts,
    calls: Vec<B2bCall>,
    timers: TimerHeap,
    out: Vec<Datagram>,
    messages: u64,
    invite_retrans: u64,
    failed: u64,
    send_drops: u64,
    unexpected: u64,
    radius_requests: u64,
    /// Access-Requests not yet answered, and the most at once.
    radius_outstanding: u64,
    radius_outstanding_peak: u64,
}

impl SipB2bua {
    /// A B2BUA for up to `calls` calls between `uac_flow` and `uas_flow`.
    pub fn new(uac_flow: u16, uas_flow: u16, calls: u32, costs: B2buaCosts) -> Self {
        let n = calls as usize;
        SipB2bua {
            uac_flow,
            uas_flow,
            radius_flow: None,
            costs,
            calls: vec![B2bCall::default(); n],
            timers: TimerHeap::with_capacity(n.min(1 << 16)),
            out: Vec::with_capacity(8),
            messages: 0,
            invite_retrans: 0,
            failed: 0,
            send_drops: 0,
            unexpected: 0,
            radius_requests: 0,
            radius_outstanding: 0,
            radius_outstanding_peak: 0,
        }
    }

    /// Authenticates credentialed INVITEs through a RADIUS server on
    /// `flow` (Sippy's `RadiusAuthorisation`) instead of locally.
    pub fn with_radius(mut self, flow: u16) -> Self {
        self.radius_flow = Some(flow);
        self
    }

    fn send_uac(&mut self, m: Msg, call: u32) {
        self.out.push(m.datagram(call, self.uac_flow));
    }

    fn send_uas(&mut self, m: Msg, call: u32) {
        self.out.push(m.datagram(call, self.uas_flow));
    }

    /// Handles one message; returns the extra CPU time it needed beyond
    /// parsing (the digest check).
    fn handle(&mut self, d: Datagram, now: Time) -> Time {
        let Some((call, msg)) = Msg::decode(d.seq) else {
            self.unexpected += 1;
            return 0;
        };
        let Some(c) = self.calls.get(call as usize).copied() else {
            self.unexpected += 1;
            return 0;
        };
        let from_uac = d.flow == self.uac_flow;
        let mut extra = 0;
        let mut leg = c.leg;
        match (from_uac, msg, c.leg) {
            // The first INVITE is challenged (and a retransmission of it
            // gets the same 407 again).
            (true, Msg::Invite, Leg::Idle | Leg::Challenged) => {
                self.send_uac(Msg::ProxyAuth, call);
                leg = Leg::Challenged;
            }
            (true, Msg::Ack, Leg::Challenged) => {}
            (true, Msg::InviteAuth, Leg::Challenged) => {
                extra = self.costs.auth;
                match self.radius_flow {
                    Some(flow) => {
                        extra += self.costs.radius_request;
                        self.out.push(Msg::AccessRequest.datagram(call, flow));
                        self.radius_requests += 1;
                        self.radius_outstanding += 1;
                        self.radius_outstanding_peak =
                            self.radius_outstanding_peak.max(self.radius_outstanding);
                        leg = Leg::Authorizing;
                    }
                    None => {
                        self.forward_invite(call, now);
                        leg = Leg::Proceeding;
                    }
                }
            }
            // A retransmission while the RADIUS answer is awaited: the
            // server transaction has sent nothing yet, so nothing to repeat.
            (true, Msg::InviteAuth, Leg::Authorizing) => {}
            (false, Msg::AccessAccept, Leg::Authorizing) if Some(d.flow) == self.radius_flow => {
                self.radius_outstanding = self.radius_outstanding.saturating_sub(1);
                self.forward_invite(call, now);
                leg = Leg::Proceeding;
            }
            // A retransmitted INVITE gets the latest response again.
            (true, Msg::InviteAuth, Leg::Proceeding) => self.send_uac(Msg::Trying, call),
            (true, Msg::InviteAuth, Leg::Ringing) => self.send_uac(Msg::Ringing, call),
            (true, Msg::InviteAuth, Leg::Answered) => self.send_uac(Msg::Ok, call),
            (false, Msg::Ringing, Leg::Proceeding) => {
                self.calls[call as usize].invite.next = None;
                self.send_uac(Msg::Ringing, call);
                leg = Leg::Ringing;
            }
            (false, Msg::Ok, Leg::Proceeding | Leg::Ringing) => {
                self.calls[call as usize].invite.next = None;
                self.send_uac(Msg::Ok, call);
                leg = Leg::Answered;
            }
            (true, Msg::Ack, Leg::Answered) => {
                self.send_uas(Msg::Ack, call);
                leg = Leg::Confirmed;
            }
            (false, Msg::Ok, Leg::Confirmed) => self.send_uas(Msg::Ack, call),
            (true, Msg::Bye, Leg::Answered | Leg::Confirmed | Leg::Closing) => {
                self.send_uas(Msg::Bye, call);
                leg = Leg::Closing;
            }
            (false, Msg::ByeOk, Leg::Closing) => {
                self.send_uac(Msg::ByeOk, call);
                leg = Leg::Done;
            }
            _ => self.unexpected += 1,
        }
        self.calls[call as usize].leg = leg;
        extra
    }

    /// The caller is authorised: 100 Trying to the UAC, the INVITE to the
    /// UAS with its client transaction's Timer A.
    fn forward_invite(&mut self, call: u32, now: Time) {
        self.send_uac(Msg::Trying, call);
        self.send_uas(Msg::Invite, call);
        let t = InviteTimer::start(now);
        self.calls[call as usize].invite = t;
        if let Some(at) = t.next {
            self.timers.push(at, call);
        }
    }

    /// Runs one due Timer A of the outgoing leg, if any; returns whether
    /// one ran.
    fn run_timer(&mut self, now: Time) -> bool {
        while let Some((t, call)) = self.timers.pop_due(now) {
            let c = &mut self.calls[call as usize];
            if c.leg != Leg::Proceeding || c.invite.next != Some(t) {
                continue;
            }
            if c.invite.fire(now) {
                let next = c.invite.next;
                self.invite_retrans += 1;
                self.send_uas(Msg::Invite, call);
                if let Some(at) = next {
                    self.timers.push(at, call);
                }
            } else {
                c.leg = Leg::Failed;
                self.failed += 1;
            }
            return true;
        }
        false
    }
}

impl App for SipB2bua {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let now = sys.now;
        // The responses and requests the last message produced.
        let mut sent = 0;
        for d in self.out.drain(..) {
            sent += 1;
            if !sys.udp_send(d) {
                self.send_drops += 1;
            }
        }
        if sent > 0 {
            return TaskStep::Compute(sent * self.costs.syscall);
        }
        if self.run_timer(now) {
            return TaskStep::Compute(self.costs.message);
        }
        if let Some(d) = sys.recv() {
            // A RADIUS answer reaches the reactor through the radiusclient
            // process and the worker thread's pipe, not as a SIP message.
            let base = if Some(d.flow) == self.radius_flow {
                self.costs.radius_reply
            } else {
                self.messages += 1;
                self.costs.message
            };
            let extra = self.handle(d, now);
            return TaskStep::Compute(self.costs.syscall + base + extra);
        }
        match self.timers.peek() {
            Some(t) => TaskStep::WaitUntil(t),
            None => TaskStep::Block,
        }
    }

    fn reset_metrics(&mut self) {
        self.messages = 0;
        self.invite_retrans = 0;
        self.send_drops = 0;
        self.unexpected = 0;
        self.radius_requests = 0;
        self.radius_outstanding_peak = self.radius_outstanding;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("sip.b2bua_messages".into(), self.messages as f64);
        out.insert(
            "sip.b2bua_invite_retrans".into(),
            self.invite_retrans as f64,
        );
        out.insert("sip.b2bua_failed".into(), self.failed as f64);
        out.insert("sip.b2bua_send_drops".into(), self.send_drops as f64);
        out.insert("sip.b2bua_unexpected".into(), self.unexpected as f64);
        out.insert("sip.radius_requests".into(), self.radius_requests as f64);
        out.insert(
            "sip.radius_outstanding_peak".into(),
            self.radius_outstanding_peak as f64,
        );
    }
}

// ------------------------------------------------------------------ UAC --

/// The client's call pattern (SIPp `-r rate -d duration -m calls`).
#[derive(Clone, Copy, Debug)]
pub struct CallPattern {
    /// New calls per second.
    pub rate_cps: f64,
    /// How long an answered call lasts before the BYE.
    pub duration: Time,
    /// Calls to place.
    pub calls: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum UacState {
    #[default]
    Idle,
    /// Waiting for the 407.
    Inviting,
    /// Credentialed INVITE sent, no response yet.
    InvitingAuth,
    /// A provisional response came: retransmissions stop.
    Proceeding,
    /// 200 received and ACKed; the BYE is due at `bye_at`.
    Established,
    /// BYE sent.
    Closing,
    Done,
    Failed,
}

#[derive(Clone, Copy, Debug, Default)]
struct UacCall {
    state: UacState,
    started: Time,
    invite: InviteTimer,
    bye_at: Time,
}

/// Set-up latency buckets, as SIPp's response-time repartition reports them.
const BUCKET_MS: [Time; 3] = [10, 100, 200];

/// How long SIPp's call-generation task keeps opening due calls in one
/// run: it stops when its millisecond clock ticks, and the calls it did
/// not get to are not opened later (it counts them as made when it
/// computes how many are due). A UAC whose CPU cannot keep up thus places
/// fewer calls than the rate, instead of falling further behind.
const SCHEDULER_TICK: Time = MS;

/// A SIPp-like UAC on the load generator.
///
/// Call k is due k / `rate_cps` seconds after the start (`-r`); a call
/// not placed when due is not placed later. It keeps at most
/// [`SipUac::open_limit`] calls open (SIPp's `-l`, at its default), so its
/// state is bounded whatever the rate; due calls beyond the limit, or
/// beyond what it opens in one scheduler tick, are counted as not placed.
pub struct SipUac {
    flow: u16,
    pattern: CallPattern,
    message_cost: Time,
    calls: Vec<UacCall>,
    timers: TimerHeap,
    /// Index of the next call placed (calls are numbered as placed).
    next_call: u32,
    /// Arrival slots elapsed: slot k is due k / rate_cps after the start.
    slot: u64,
    open: u32,
    open_limit: u32,
    open_peak: u32,
    offered: u64,
    not_placed: u64,
    /// Calls placed since the measurement started count.
    measured_from: u32,
    buckets: [u64; 4],
    setup_sum: Time,
    established: u64,
    completed: u64,
    failed: u64,
    invite_retrans: u64,
    first_setup: Option<Time>,
    last_setup: Time,
}

impl SipUac {
    /// A UAC placing calls on `flow` with `pattern`; each message it sends
    /// or receives costs `message_cost` of its CPU.
    pub fn new(flow: u16, pattern: CallPattern, message_cost: Time) -> Self {
        let n = pattern.calls as usize;
        SipUac {
            flow,
            pattern,
            message_cost,
            calls: vec![UacCall::default(); n],
            timers: TimerHeap::with_capacity(n.min(1 << 16)),
            next_call: 0,
            slot: 0,
            open: 0,
            open_limit: Self::open_limit(&pattern),
            open_peak: 0,
            offered: 0,
            not_placed: 0,
            measured_from: 0,
            buckets: [0; 4],
            setup_sum: 0,
            established: 0,
            completed: 0,
            failed: 0,
            invite_retrans: 0,
            first_setup: None,
            last_setup: 0,
        }
    }

    /// SIPp's default `-l`: three times the calls a rate keeps open,
    /// rate × call duration, with the duration taken as at least 1 s; at
    /// least one call.
    pub fn open_limit(p: &CallPattern) -> u32 {
        let hold = as_s(p.duration).max(1.0);
        ((3.0 * p.rate_cps * hold) as u32).max(1)
    }

    /// When arrival slot `k` is due (computed from k, so the interval's
    /// rounding does not add up).
    fn slot_at(&self, k: u64) -> Time {
        (k as f64 * SEC as f64 / self.pattern.rate_cps).round() as Time
    }

    /// A call left the open set (completed or failed).
    fn closed(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    fn send(io: &mut PeerIo, m: Msg, call: u32, flow: u16) {
        io.udp_tx.push(m.datagram(call, flow));
    }

    fn measured(&self, call: u32) -> bool {
        call >= self.measured_from
    }

    fn answered(&mut self, call: u32, now: Time) {
        let c = &mut self.calls[call as usize];
        let setup = now - c.started;
        c.state = UacState::Established;
        c.bye_at = now + self.pattern.duration;
        let bye_at = c.bye_at;
        self.timers.push(bye_at, call);
        if self.measured(call) {
            self.established += 1;
            self.setup_sum += setup;
            let b = BUCKET_MS
                .iter()
                .position(|&ms| setup < ms * MS)
                .unwrap_or(BUCKET_MS.len());
            self.buckets[b] += 1;
            self.first_setup.get_or_insert(now);
            self.last_setup = now;
        }
    }

    fn receive(&mut self, io: &mut PeerIo, d: Datagram, now: Time) {
        let Some((call, msg)) = Msg::decode(d.seq) else {
            return;
        };
        let Some(c) = self.calls.get(call as usize).copied() else {
            return;
        };
        let flow = self.flow;
        match (msg, c.state) {
            (Msg::ProxyAuth, UacState::Inviting) => {
                Self::send(io, Msg::Ack, call, flow);
                Self::send(io, Msg::InviteAuth, call, flow);
                let t = InviteTimer::start(now);
                let c = &mut self.calls[call as usize];
                c.invite = t;
                c.state = UacState::InvitingAuth;
                if let Some(at) = t.next {
                    self.timers.push(at, call);
                }
            }
            (Msg::Trying | Msg::Ringing, UacState::InvitingAuth) => {
                self.calls[call as usize].state = UacState::Proceeding;
            }
            (Msg::Ok, UacState::InvitingAuth | UacState::Proceeding) => {
                Self::send(io, Msg::Ack, call, flow);
                self.answered(call, now);
            }
            // A retransmitted 200 is ACKed again.
            (Msg::Ok, UacState::Established) => Self::send(io, Msg::Ack, call, flow),
            (Msg::ByeOk, UacState::Closing) => {
                self.calls[call as usize].state = UacState::Done;
                self.closed();
                if self.measured(call) {
                    self.completed += 1;
                }
            }
            _ => {}
        }
    }

    fn timer(&mut self, io: &mut PeerIo, t: Time, call: u32, now: Time) {
        let flow = self.flow;
        let measured = self.measured(call);
        let c = &mut self.calls[call as usize];
        match c.state {
            UacState::Inviting | UacState::InvitingAuth if c.invite.next == Some(t) => {
                if c.invite.fire(now) {
                    let m = if c.state == UacState::Inviting {
                        Msg::Invite
                    } else {
                        Msg::InviteAuth
                    };
                    if let Some(at) = c.invite.next {
                        self.timers.push(at, call);
                    }
                    Self::send(io, m, call, flow);
                    if measured {
                        self.invite_retrans += 1;
                    }
                } else {
                    c.state = UacState::Failed;
                    self.closed();
                    if measured {
                        self.failed += 1;
                    }
                }
            }
            UacState::Established if c.bye_at == t => {
                c.state = UacState::Closing;
                Self::send(io, Msg::Bye, call, flow);
            }
            _ => {}
        }
    }
}

impl PeerApp for SipUac {
    fn poll(&mut self, io: &mut PeerIo, now: Time) -> (Time, Option<Time>) {
        let mut handled = 0u64;
        while let Some(d) = io.udp_rx.pop_front() {
            handled += 1;
            self.receive(io, d, now);
        }
        while let Some((t, call)) = self.timers.pop_due(now) {
            self.timer(io, t, call, now);
        }
        // New calls at a fixed interval, within the open-call limit and
        // one scheduler tick of work.
        let mut opening = 0;
        while self.next_call < self.pattern.calls && self.slot_at(self.slot) <= now {
            self.slot += 1;
            self.offered += 1;
            if self.open >= self.open_limit || opening >= SCHEDULER_TICK {
                self.not_placed += 1;
                continue;
            }
            opening += self.message_cost;
            let call = self.next_call;
            self.next_call += 1;
            self.open += 1;
            self.open_peak = self.open_peak.max(self.open);
            self.calls[call as usize] = UacCall {
                state: UacState::Inviting,
                started: now,
                invite: InviteTimer::start(now),
                bye_at: 0,
            };
            self.timers.push(now + T1, call);
            Self::send(io, Msg::Invite, call, self.flow);
        }
        let cost = (handled + io.udp_tx.len() as u64) * self.message_cost;
        let next_call = (self.next_call < self.pattern.calls).then(|| self.slot_at(self.slot));
        let wake = [self.timers.peek(), next_call].into_iter().flatten().min();
        (cost, wake)
    }

    fn reset_metrics(&mut self) {
        // Calls placed from now on are measured.
        self.measured_from = self.next_call;
        self.offered = 0;
        self.not_placed = 0;
        self.open_peak = self.open;
        self.buckets = [0; 4];
        self.setup_sum = 0;
        self.established = 0;
        self.completed = 0;
        self.failed = 0;
        self.invite_retrans = 0;
        self.first_setup = None;
    }

    fn metrics(&self, out: &mut Metrics) {
        let placed = self.next_call.saturating_sub(self.measured_from) as f64;
        let n = self.established.max(1) as f64;
        let pct = |b: u64| 100.0 * b as f64 / n;
        out.insert("sip.calls_offered".into(), self.offered as f64);
        out.insert("sip.calls_placed".into(), placed);
        out.insert("sip.calls_not_placed".into(), self.not_placed as f64);
        out.insert("sip.open_calls".into(), self.open as f64);
        out.insert("sip.open_calls_peak".into(), self.open_peak as f64);
        out.insert("sip.calls_established".into(), self.established as f64);
        out.insert("sip.calls_completed".into(), self.completed as f64);
        out.insert("sip.calls_failed".into(), self.failed as f64);
        // Established calls per second over the span in which the measured
        // calls were set up.
        let span = self
            .last_setup
            .saturating_sub(self.first_setup.unwrap_or(0));
        let rate = if self.established > 1 && span > 0 {
            (self.established - 1) as f64 * SEC as f64 / span as f64
        } else {
            0.0
        };
        out.insert("sip.call_rate".into(), rate);
        out.insert("sip.setup_lt_10ms".into(), pct(self.buckets[0]));
        out.insert("sip.setup_10_100ms".into(), pct(self.buckets[1]));
        out.insert("sip.setup_100_200ms".into(), pct(self.buckets[2]));
        out.insert("sip.setup_gt_200ms".into(), pct(self.buckets[3]));
        out.insert(
            "sip.setup_mean_us".into(),
            self.setup_sum as f64 / n / crate::engine::US as f64,
        );
        out.insert("sip.invite_retrans".into(), self.invite_retrans as f64);
    }
}

// ------------------------------------------------------------------ UAS --

/// A SIPp-like UAS on the VM's host: answers each INVITE with 180 then
/// 200 at once, and each BYE with 200.
pub struct SipUas {
    message_cost: Time,
    answered: Vec<bool>,
    invites: u64,
    invite_dups: u64,
}

impl SipUas {
    /// A UAS for up to `calls` calls.
    pub fn new(calls: u32, message_cost: Time) -> Self {
        SipUas {
            message_cost,
            answered: vec![false; calls as usize],
            invites: 0,
            invite_dups: 0,
        }
    }
}

impl PeerApp for SipUas {
    fn poll(&mut self, io: &mut PeerIo, _now: Time) -> (Time, Option<Time>) {
        let mut handled = 0u64;
        while let Some(d) = io.udp_rx.pop_front() {
            handled += 1;
            let Some((call, msg)) = Msg::decode(d.seq) else {
                continue;
            };
            let Some(done) = self.answered.get_mut(call as usize) else {
                continue;
            };
            match msg {
                Msg::Invite if !*done => {
                    *done = true;
                    self.invites += 1;
                    io.udp_tx.push(Msg::Ringing.datagram(call, d.flow));
                    io.udp_tx.push(Msg::Ok.datagram(call, d.flow));
                }
                // A retransmitted INVITE: the final response again.
                Msg::Invite => {
                    self.invite_dups += 1;
                    io.udp_tx.push(Msg::Ok.datagram(call, d.flow));
                }
                Msg::Bye => io.udp_tx.push(Msg::ByeOk.datagram(call, d.flow)),
                _ => {}
            }
        }
        let cost = (handled + io.udp_tx.len() as u64) * self.message_cost;
        (cost, None)
    }

    fn reset_metrics(&mut self) {
        self.invites = 0;
        self.invite_dups = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("sip.uas_invites".into(), self.invites as f64);
        out.insert("sip.uas_invite_dups".into(), self.invite_dups as f64);
    }
}

// --------------------------------------------------------------- RADIUS --

/// A RADIUS server (FreeRADIUS-like) on the load generator: answers each
/// Access-Request with an Access-Accept after checking the digest
/// credentials (RFC 5090); each request costs `request_cost` of its CPU.
pub struct RadiusServer {
    request_cost: Time,
    requests: u64,
}

impl RadiusServer {
    /// A server spending `request_cost` per request.
    pub fn new(request_cost: Time) -> Self {
        RadiusServer {
            request_cost,
            requests: 0,
        }
    }
}

impl PeerApp for RadiusServer {
    fn poll(&mut self, io: &mut PeerIo, _now: Time) -> (Time, Option<Time>) {
        let mut handled = 0u64;
        while let Some(d) = io.udp_rx.pop_front() {
            if let Some((call, Msg::AccessRequest)) = Msg::decode(d.seq) {
                handled += 1;
                io.udp_tx.push(Msg::AccessAccept.datagram(call, d.flow));
            }
        }
        self.requests += handled;
        (handled * self.request_cost, None)
    }

    fn reset_metrics(&mut self) {
        self.requests = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert("sip.radius_server_requests".into(), self.requests as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::app::Conns;
    use crate::guest::tcp::Tcp;
    use std::collections::VecDeque;

    #[test]
    fn messages_round_trip_through_seq() {
        for m in Msg::ALL {
            assert_eq!(Msg::decode(m.encode(12345)), Some((12345, m)));
        }
        assert_eq!(Msg::decode(0), None);
        assert_eq!(Msg::decode(0xff), None);
    }

    #[test]
    fn timer_a_doubles_until_timer_b() {
        let mut t = InviteTimer::start(0);
        let mut at = vec![];
        while let Some(n) = t.next {
            at.push(n);
            if !t.fire(n) {
                break;
            }
        }
        // T1, then 2, 4, 8, 16, 32 T1 intervals: 1, 3, 7, 15, 31, 63 T1,
        // and the next (127 T1) is past Timer B (64 T1).
        let t1: Vec<Time> = [1, 3, 7, 15, 31, 63, 127].iter().map(|k| k * T1).collect();
        assert_eq!(at, t1);
        assert_eq!(t.next, None);
    }

    /// Runs a peer app on datagrams, returning what it sent.
    fn run(app: &mut dyn PeerApp, input: &[Datagram], now: Time) -> Vec<Datagram> {
        let mut conns: Vec<Tcp> = vec![];
        let (mut touched, mut seen) = (vec![], vec![]);
        let mut rx: VecDeque<Datagram> = input.iter().copied().collect();
        let mut tx = vec![];
        let mut io = PeerIo {
            conns: Conns::new(&mut conns, &mut touched, &mut seen),
            udp_rx: &mut rx,
            udp_tx: &mut tx,
        };
        app.poll(&mut io, now);
        tx
    }

    fn msgs(ds: &[Datagram]) -> Vec<(u32, Msg)> {
        ds.iter().filter_map(|d| Msg::decode(d.seq)).collect()
    }

    /// Feeds the B2BUA one datagram and collects what it sends.
    fn b2b(b: &mut SipB2bua, d: Datagram, now: Time) -> Vec<(u16, u32, Msg)> {
        b.handle(d, now);
        b.out
            .drain(..)
            .filter_map(|o| Msg::decode(o.seq).map(|(c, m)| (o.flow, c, m)))
            .collect()
    }

    fn costs() -> B2buaCosts {
        B2buaCosts {
            message: 10,
            auth: 5,
            syscall: 1,
            radius_request: 7,
            radius_reply: 3,
        }
    }

    #[test]
    fn b2bua_waits_for_the_radius_answer_before_forwarding() {
        let (a, b, r) = (1, 2, 3);
        let mut s = SipB2bua::new(a, b, 4, costs()).with_radius(r);
        let d = |m: Msg, flow| m.datagram(2, flow);
        b2b(&mut s, d(Msg::Invite, a), 0);
        b2b(&mut s, d(Msg::Ack, a), 0);
        // The credentials go to the RADIUS server, nothing to the UAS yet;
        // the request path is charged on top of the local part.
        assert_eq!(s.handle(d(Msg::InviteAuth, a), 0), 5 + 7);
        let out: Vec<_> = s.out.drain(..).map(|o| (o.flow, o.seq)).collect();
        assert_eq!(out, [(r, Msg::AccessRequest.encode(2))]);
        // A retransmitted INVITE meanwhile is absorbed; no timer runs.
        assert_eq!(b2b(&mut s, d(Msg::InviteAuth, a), 10), []);
        assert!(!s.run_timer(10 * T1));
        // The Access-Accept releases the call: 100 to the UAC, INVITE on.
        assert_eq!(
            b2b(&mut s, d(Msg::AccessAccept, r), 20),
            [(a, 2, Msg::Trying), (b, 2, Msg::Invite)]
        );
        assert_eq!(s.radius_requests, 1);
        assert_eq!(s.radius_outstanding, 0);
        assert_eq!(s.radius_outstanding_peak, 1);
        // An Access-Accept on a SIP flow is not one.
        assert_eq!(b2b(&mut s, d(Msg::AccessAccept, a), 30), []);
        assert_eq!(s.unexpected, 1);
    }

    #[test]
    fn radius_server_accepts_each_request() {
        let mut srv = RadiusServer::new(4);
        let out = run(
            &mut srv,
            &[
                Msg::AccessRequest.datagram(5, 3),
                Msg::Invite.datagram(6, 3),
                Msg::AccessRequest.datagram(7, 3),
            ],
            0,
        );
        assert_eq!(msgs(&out), [(5, Msg::AccessAccept), (7, Msg::AccessAccept)]);
        let mut m = Metrics::new();
        srv.metrics(&mut m);
        assert_eq!(m["sip.radius_server_requests"], 2.0);
    }

    #[test]
    fn b2bua_relays_a_whole_call() {
        let (a, b) = (1, 2);
        let mut s = SipB2bua::new(a, b, 4, costs());
        let d = |m: Msg, flow| m.datagram(3, flow);
        assert_eq!(b2b(&mut s, d(Msg::Invite, a), 0), [(a, 3, Msg::ProxyAuth)]);
        assert_eq!(b2b(&mut s, d(Msg::Ack, a), 0), []);
        assert_eq!(
            b2b(&mut s, d(Msg::InviteAuth, a), 0),
            [(a, 3, Msg::Trying), (b, 3, Msg::Invite)]
        );
        assert_eq!(b2b(&mut s, d(Msg::Ringing, b), 0), [(a, 3, Msg::Ringing)]);
        assert_eq!(b2b(&mut s, d(Msg::Ok, b), 0), [(a, 3, Msg::Ok)]);
        assert_eq!(b2b(&mut s, d(Msg::Ack, a), 0), [(b, 3, Msg::Ack)]);
        assert_eq!(b2b(&mut s, d(Msg::Bye, a), 0), [(b, 3, Msg::Bye)]);
        assert_eq!(b2b(&mut s, d(Msg::ByeOk, b), 0), [(a, 3, Msg::ByeOk)]);
        assert_eq!(s.unexpected, 0);
        // Out-of-dialog messages are counted, not relayed.
        assert_eq!(b2b(&mut s, d(Msg::ByeOk, b), 0), []);
        assert_eq!(s.unexpected, 1);
    }

    #[test]
    fn b2bua_retransmits_its_invite_until_a_response() {
        let (a, b) = (1, 2);
        let mut s = SipB2bua::new(a, b, 1, costs());
        b2b(&mut s, Msg::Invite.datagram(0, a), 0);
        b2b(&mut s, Msg::InviteAuth.datagram(0, a), 0);
        assert!(!s.run_timer(T1 - 1));
        assert!(s.run_timer(T1));
        assert_eq!(msgs(&s.out), [(0, Msg::Invite)]);
        s.out.clear();
        // Next one 2·T1 later; a 180 stops it.
        assert!(!s.run_timer(3 * T1 - 1));
        b2b(&mut s, Msg::Ringing.datagram(0, b), 3 * T1 - 1);
        assert!(!s.run_timer(10 * T1));
        assert_eq!(s.invite_retrans, 1);
    }

    #[test]
    fn uac_paces_calls_measures_setup_and_hangs_up() {
        let pattern = CallPattern {
            rate_cps: 100.0,
            duration: SEC,
            calls: 3,
        };
        let mut u = SipUac::new(1, pattern, 0);
        assert_eq!(msgs(&run(&mut u, &[], 0)), [(0, Msg::Invite)]);
        // 10 ms later: the second call.
        assert_eq!(msgs(&run(&mut u, &[], 10 * MS)), [(1, Msg::Invite)]);
        let out = run(&mut u, &[Msg::ProxyAuth.datagram(0, 1)], 11 * MS);
        assert_eq!(msgs(&out), [(0, Msg::Ack), (0, Msg::InviteAuth)]);
        run(&mut u, &[Msg::Trying.datagram(0, 1)], 12 * MS);
        let out = run(&mut u, &[Msg::Ok.datagram(0, 1)], 150 * MS);
        // The third call is due too (20 ms).
        assert_eq!(msgs(&out), [(0, Msg::Ack), (2, Msg::Invite)]);
        let mut m = Metrics::new();
        u.metrics(&mut m);
        assert_eq!(m["sip.setup_100_200ms"], 100.0);
        assert_eq!(m["sip.calls_established"], 1.0);
        // Call 1 got no answer: its INVITE is retransmitted at T1.
        let out = run(&mut u, &[], 10 * MS + T1);
        assert_eq!(msgs(&out), [(1, Msg::Invite)]);
        // The BYE one call duration after the 200.
        let out = run(&mut u, &[], 150 * MS + SEC);
        assert!(msgs(&out).contains(&(0, Msg::Bye)));
        run(&mut u, &[Msg::ByeOk.datagram(0, 1)], 151 * MS + SEC);
        let mut m = Metrics::new();
        u.metrics(&mut m);
        assert_eq!(m["sip.calls_completed"], 1.0);
        assert!(m["sip.invite_retrans"] >= 1.0);
    }

    fn uac_metric(u: &SipUac, k: &str) -> f64 {
        let mut m = Metrics::new();
        u.metrics(&mut m);
        m[k]
    }

    #[test]
    fn uac_places_calls_at_the_rate_and_no_more() {
        // 1000 calls/s polled at every call it asks for, for 1 s.
        let pattern = CallPattern {
            rate_cps: 1000.0,
            duration: 10 * SEC,
            calls: 100_000,
        };
        let mut u = SipUac::new(1, pattern, 0);
        let mut now = 0;
        while now <= SEC {
            run(&mut u, &[], now);
            // Its wake-up: the next call (Timer A comes later).
            now = u.slot_at(u.slot);
        }
        // Calls at 0, 1 ms, ..., 1 s: exactly 1001, all placed.
        assert_eq!(uac_metric(&u, "sip.calls_offered"), 1001.0);
        assert_eq!(uac_metric(&u, "sip.calls_placed"), 1001.0);
        // A rate whose interval is not a whole number of picoseconds does
        // not drift: call 3,000,000 of 3 calls/s is due at exactly 1e6 s.
        let p3 = CallPattern {
            rate_cps: 3.0,
            ..pattern
        };
        assert_eq!(SipUac::new(1, p3, 0).slot_at(3_000_000), 1_000_000 * SEC);
    }

    #[test]
    fn uac_behind_its_schedule_skips_calls_instead_of_bursting() {
        // 100,000 calls/s, 20 us per message: the UAC first runs 1 s late.
        let pattern = CallPattern {
            rate_cps: 1e5,
            duration: SEC,
            calls: 1_000_000,
        };
        let mut u = SipUac::new(1, pattern, 20 * crate::engine::US);
        let out = run(&mut u, &[], SEC);
        // 100,001 calls due; one scheduler tick (1 ms) opens 50 of them.
        assert_eq!(uac_metric(&u, "sip.calls_offered"), 100_001.0);
        assert_eq!(out.len(), 50);
        assert_eq!(uac_metric(&u, "sip.calls_placed"), 50.0);
        assert_eq!(uac_metric(&u, "sip.calls_not_placed"), 100_001.0 - 50.0);
    }

    #[test]
    fn uac_keeps_at_most_its_open_call_limit() {
        // SIPp's default -l: 3 × 100 calls/s × 2 s = 600 calls.
        let pattern = CallPattern {
            rate_cps: 100.0,
            duration: 2 * SEC,
            calls: 100_000,
        };
        assert_eq!(SipUac::open_limit(&pattern), 600);
        let mut u = SipUac::new(1, pattern, 0);
        // Nothing is ever answered: calls stay open until Timer B (32 s).
        for k in 0..=20 {
            run(&mut u, &[], k * SEC);
        }
        assert_eq!(uac_metric(&u, "sip.calls_offered"), 2001.0);
        assert_eq!(uac_metric(&u, "sip.calls_placed"), 600.0);
        assert_eq!(uac_metric(&u, "sip.open_calls_peak"), 600.0);
        assert_eq!(uac_metric(&u, "sip.calls_not_placed"), 1401.0);
        // Past Timer B the first calls fail and free their places.
        run(&mut u, &[], 40 * SEC);
        assert!(uac_metric(&u, "sip.open_calls") <= 600.0);
        assert!(uac_metric(&u, "sip.calls_failed") > 0.0);
        assert!(uac_metric(&u, "sip.calls_placed") > 600.0);
    }

    #[test]
    fn uas_answers_and_repeats_its_final_response() {
        let mut u = SipUas::new(2, 0);
        let out = run(&mut u, &[Msg::Invite.datagram(1, 7)], 0);
        assert_eq!(msgs(&out), [(1, Msg::Ringing), (1, Msg::Ok)]);
        assert!(out.iter().all(|d| d.flow == 7));
        let out = run(&mut u, &[Msg::Invite.datagram(1, 7)], 1);
        assert_eq!(msgs(&out), [(1, Msg::Ok)]);
        let out = run(&mut u, &[Msg::Bye.datagram(1, 7)], 2);
        assert_eq!(msgs(&out), [(1, Msg::ByeOk)]);
    }
}
