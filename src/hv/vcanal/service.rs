//! The vCanal service (vcanal.md §2.1, §2.4): the host side of every VM's
//! channel. The polling thread gives each VM a turn ([`Service::turn`]):
//! it takes that VM's INRs from its ring, copies and validates each one,
//! queues the good ones by class and answers the bad ones in place, then
//! issues the VM's queued calls, in the channel scheduler's order, to idle
//! network-pool threads. A pool thread runs the call on the host stack and
//! hands the result back ([`Service::complete`]), which writes it into the
//! INR and says whether the waiter asked for a completion interrupt.
//!
//! # What a guest may do, and what the host does about it
//!
//! The channel is guest memory: any byte of it may be anything, at any
//! time. The service
//! - reads each INR **once**, into host memory, before looking at it; every
//!   later step uses that copy, so rewriting the INR afterwards changes
//!   nothing the host does (the host only ever writes `state`, `ret` and
//!   out-parameters back, and reads `want_irq` after completing);
//! - refuses, in the ring slot's `status`, an entry naming no INR of the
//!   pool (EINVAL) or an INR not in `REQUESTED` state (EBUSY: a duplicate
//!   or stale entry), since there is no INR to answer;
//! - answers in the INR's `ret` (state `COMPLETED`): an unknown call type
//!   (ENOSYS), bad arguments (EINVAL, EPROTONOSUPPORT), an index outside
//!   the VM's socket array or naming no open socket (EBADF), the wrong
//!   kind of socket (ENOTSOCK, EINVAL, EOPNOTSUPP), a buffer outside guest
//!   RAM or whose end overflows (EFAULT), a full socket array (EMFILE), a
//!   port in use (EADDRINUSE, EADDRNOTAVAIL);
//! - does bounded work per turn: at most `ring_budget` ring entries, at
//!   most the scheduler's budgets of calls; class queues of fixed size
//!   (when one is full the ring is left alone until the next turn); no
//!   host allocation after [`Service::new`];
//! - resolves socket indices only in the socket array of the VM whose
//!   channel the INR came from, and only when the call is issued (not when
//!   it was queued), so a call never carries another VM's host socket nor
//!   a host socket freed meanwhile.

use super::channel::{ChannelError, ChannelLayout, ChannelLimits, Consumer};
use super::scheduler::{class_of, ChannelScheduler, SchedParams};
use super::translator::{GuestAddr, Translator, TranslatorParams};
use crate::guest::libcanal::inr::{
    off, Call, CallType, Errno, Inr, InrCall, SockAddr, SockType, INR_COMPLETED, INR_IN_SERVICE,
    INR_REQUESTED, INR_SIZE,
};
use crate::hw::guest_memory::{GuestMemory, MemError};

/// A socket of the host stack (its descriptor in the service process).
pub type HostSocket = u32;

/// Configuration of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceParams {
    /// Length of each VM's host socket array (§3.5): the indices an INR
    /// may name. Linux's default RLIMIT_NOFILE soft limit is 1024.
    pub sockets_per_vm: u32,
    /// Largest ring and pool a VM may announce.
    pub limits: ChannelLimits,
    /// Ring entries taken per VM turn (bounded work per poll).
    pub ring_budget: u32,
    /// Calls each per-VM class queue holds.
    pub queue_capacity: u32,
    /// Channel scheduler budgets (an assumption: see [`SchedParams`]).
    pub sched: SchedParams,
    /// Host ports for guests' TCP binds.
    pub tcp_ports: TranslatorParams,
    /// Host ports for guests' UDP binds.
    pub udp_ports: TranslatorParams,
}

impl Default for ServiceParams {
    /// Sizes, not costs: a socket array as large as Linux's default fd
    /// limit; rings up to 1024 slots (16 KiB, "a few pages", §5) and pools
    /// up to 1024 INRs (80 KiB); a turn takes at most as many entries as
    /// the scheduler's budgets can serve in one turn; class queues of 256;
    /// host ports from Linux's default ephemeral range (32768–60999).
    fn default() -> Self {
        let sched = SchedParams::default();
        let ports = TranslatorParams {
            first_port: 32768,
            ports: 28232,
            max_probes: 256,
        };
        Self {
            sockets_per_vm: 1024,
            limits: ChannelLimits {
                max_ring_capacity: 1024,
                max_pool_len: 1024,
            },
            ring_budget: sched.cmd_budget + sched.rx_budget + sched.tx_budget,
            queue_capacity: 256,
            sched,
            tcp_ports: ports,
            udp_ports: ports,
        }
    }
}

/// What a socket-array entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// A TCP socket.
    Stream,
    /// A UDP socket.
    Dgram,
    /// An epoll instance.
    Epoll,
}

/// One entry of a VM's socket array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Unused.
    Free,
    /// Held for a socket(), accept() or epoll_create() in progress.
    Reserved,
    /// A host socket.
    Open {
        /// The host's socket.
        host: HostSocket,
        /// What it is.
        kind: SlotKind,
        /// The host port its bind() was translated to.
        port: Option<u16>,
    },
}

/// Why a service call failed (the caller's mistake, never the guest's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The announcement was refused.
    #[error("{0}")]
    Channel(#[from] ChannelError),
    /// The VM announced a channel already.
    #[error("VM {0} announced its channel already")]
    AlreadyAnnounced(usize),
    /// No such VM.
    #[error("no VM {0}")]
    NoVm(usize),
    /// The memory passed is not the one the channel was checked against.
    #[error("{0}")]
    Mem(#[from] MemError),
}

/// A validated call waiting in a class queue: the host's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Queued {
    inr: u32,
    call: InrCall,
}

/// A call handed to a network-pool thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The VM.
    pub vm: usize,
    /// Its INR (pool index), to answer.
    pub inr: u32,
    /// The call as the host copied and checked it. Socket indices in it
    /// are the guest's; use `socket` and `target`. Its buffer is a GPA
    /// range inside guest RAM (HVA = guest RAM's mapping + GPA, §2.6).
    pub call: InrCall,
    /// The host socket (or epoll instance) the call's index names in this
    /// VM's array.
    pub socket: Option<HostSocket>,
    /// What `socket` is.
    pub kind: Option<SlotKind>,
    /// EpollCtl: the host socket of its target index.
    pub target: Option<HostSocket>,
    /// Socket, Accept, EpollCreate: the array index held for the new
    /// socket, and its kind.
    pub new_slot: Option<(u32, SlotKind)>,
    /// Bind: the host port the guest's address was translated to.
    pub host_port: Option<u16>,
}

/// What a pool thread reports for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Success with this return value (bytes moved, ready count, 0).
    Value(u64),
    /// socket(), accept(), epoll_create(): the host's new socket.
    NewSocket(HostSocket),
    /// The host call failed.
    Failed(Errno),
}

/// Work one turn did, for the caller to charge (see
/// [`super::VcanalCosts::turn`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnReport {
    /// The VM served.
    pub vm: usize,
    /// Ring entries consumed.
    pub taken: u32,
    /// Of those, entries refused in the ring slot (no INR to answer).
    pub refused: u32,
    /// INRs answered with a validation error (when taken or when issued).
    pub rejected: u32,
    /// INRs queued by class.
    pub queued: u32,
    /// Calls issued to pool threads.
    pub issued: u32,
    /// Binds translated to a host port.
    pub translations: u32,
    /// Answers written whose waiter wants a completion interrupt.
    pub irqs: u32,
    /// A class queue was full, so ring entries were left for later.
    pub blocked: bool,
}

impl TurnReport {
    /// Whether the turn found nothing to do (an idle poll round).
    pub fn idle(&self) -> bool {
        self.taken == 0 && self.issued == 0 && self.rejected == 0
    }
}

/// Running totals of one VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmStats {
    /// Ring entries consumed.
    pub taken: u64,
    /// Ring entries refused in the slot.
    pub refused: u64,
    /// INRs answered with a validation error.
    pub rejected: u64,
    /// INRs queued.
    pub queued: u64,
    /// Calls issued to pool threads.
    pub issued: u64,
    /// Calls completed by pool threads.
    pub completed: u64,
    /// Completion interrupts asked for.
    pub irqs: u64,
}

/// One VM as the service sees it.
#[derive(Clone, Debug)]
struct VmChannel {
    ring: Option<Consumer>,
    sockets: Vec<Slot>,
    stats: VmStats,
}

/// The vCanal service.
#[derive(Clone, Debug)]
pub struct Service {
    params: ServiceParams,
    vms: Vec<VmChannel>,
    sched: ChannelScheduler<Queued>,
    tcp: Translator,
    udp: Translator,
}

/// Writes an answer into INR `inr` (after an optional out-address at
/// `params[addr_at..]`): `ret`, then `state = COMPLETED`, then reads
/// `want_irq` (§7: the waiter sets it before re-checking `state`, so one of
/// the two sides sees the other). Returns whether to interrupt.
fn answer(
    mem: &mut GuestMemory,
    gpa: u64,
    ret: i64,
    out_addr: Option<(usize, SockAddr)>,
) -> Result<bool, MemError> {
    if let Some((i, a)) = out_addr {
        let p = gpa + off::PARAMS + 8 * i as u64;
        mem.write_u64(p, a.ip as u64)?;
        mem.write_u64(p + 8, a.port as u64)?;
    }
    mem.write_u64(gpa + off::RET, ret as u64)?;
    mem.write_u32(gpa + off::STATE, INR_COMPLETED)?;
    Ok(mem.read_u32(gpa + off::WANT_IRQ)? != 0)
}

impl Service {
    /// A service for `vms` VMs, with every table allocated now.
    pub fn new(vms: usize, params: ServiceParams) -> Self {
        Self {
            vms: (0..vms)
                .map(|_| VmChannel {
                    ring: None,
                    sockets: vec![Slot::Free; params.sockets_per_vm as usize],
                    stats: VmStats::default(),
                })
                .collect(),
            sched: ChannelScheduler::new(vms, params.queue_capacity as usize, params.sched),
            tcp: Translator::new(params.tcp_ports),
            udp: Translator::new(params.udp_ports),
            params,
        }
    }

    /// The helper driver's announcement (the boot-time exit, §3.2): the
    /// channel of `vm` lies at `layout` in `mem`. Checked against the
    /// host's limits and the VM's RAM.
    pub fn announce(
        &mut self,
        vm: usize,
        layout: ChannelLayout,
        mem: &GuestMemory,
    ) -> Result<(), ServiceError> {
        let v = self.vms.get_mut(vm).ok_or(ServiceError::NoVm(vm))?;
        if v.ring.is_some() {
            return Err(ServiceError::AlreadyAnnounced(vm));
        }
        layout.check(mem, &self.params.limits)?;
        v.ring = Some(Consumer::new(layout));
        Ok(())
    }

    /// The position `vm`'s ring is consumed up to (None: no channel).
    pub fn ring_head(&self, vm: usize) -> Option<u64> {
        Some(self.vms.get(vm)?.ring?.head)
    }

    /// The VM whose turn is next.
    pub fn next_vm(&self) -> usize {
        self.sched.current()
    }

    /// Totals of `vm` (zero for no such VM).
    pub fn stats(&self, vm: usize) -> VmStats {
        self.vms.get(vm).map(|v| v.stats).unwrap_or_default()
    }

    /// Entry `index` of `vm`'s socket array.
    pub fn slot(&self, vm: usize, index: u32) -> Option<Slot> {
        self.vms.get(vm)?.sockets.get(index as usize).copied()
    }

    /// The host socket `index` names in `vm`'s array: for the fd indices
    /// a pool thread reads from a select/poll buffer (None: answer EBADF
    /// for that entry).
    pub fn socket_of(&self, vm: usize, index: u32) -> Option<HostSocket> {
        match self.slot(vm, index)? {
            Slot::Open { host, kind, .. } if kind != SlotKind::Epoll => Some(host),
            _ => None,
        }
    }

    /// The guest address a packet to host `port` belongs to.
    pub fn guest_of(&self, kind: SockType, port: u16) -> Option<GuestAddr> {
        match kind {
            SockType::Stream => self.tcp.guest_of(port),
            SockType::Dgram => self.udp.guest_of(port),
        }
    }

    /// Whether no validated call waits in any class queue.
    pub fn queues_empty(&self) -> bool {
        self.sched.is_empty()
    }

    /// Bytes of host memory the service's tables hold (constant after
    /// [`Service::new`]: nothing grows with what guests write).
    pub fn allocated(&self) -> usize {
        let sockets: usize = self
            .vms
            .iter()
            .map(|v| v.sockets.capacity() * std::mem::size_of::<Slot>())
            .sum();
        self.vms.capacity() * std::mem::size_of::<VmChannel>()
            + sockets
            + self.sched.allocated()
            + self.tcp.allocated()
            + self.udp.allocated()
    }

    /// One turn of the polling thread for the VM whose turn it is (`mem`
    /// is that VM's memory): take up to `ring_budget` INRs from its ring,
    /// then issue up to `idle` of its queued calls (the idle pool threads)
    /// through `issue`, in class order within the scheduler's budgets.
    /// The next turn is the next VM's.
    pub fn turn(
        &mut self,
        mem: &mut GuestMemory,
        idle: usize,
        mut issue: impl FnMut(Dispatch),
    ) -> Result<TurnReport, ServiceError> {
        let vm = self.sched.current();
        if vm >= self.vms.len() {
            return Err(ServiceError::NoVm(vm));
        }
        let mut r = TurnReport {
            vm,
            ..TurnReport::default()
        };
        let result = self
            .drain(vm, mem, &mut r)
            .and_then(|()| self.serve(vm, mem, idle, &mut issue, &mut r));
        self.sched.end_turn();
        let s = &mut self.vms[vm].stats;
        s.taken += r.taken as u64;
        s.refused += r.refused as u64;
        s.rejected += r.rejected as u64;
        s.queued += r.queued as u64;
        s.issued += r.issued as u64;
        s.irqs += r.irqs as u64;
        result.map(|()| r).map_err(ServiceError::from)
    }

    /// Takes INRs from `vm`'s ring into its class queues.
    fn drain(
        &mut self,
        vm: usize,
        mem: &mut GuestMemory,
        r: &mut TurnReport,
    ) -> Result<(), MemError> {
        let Some(mut ring) = self.vms[vm].ring else {
            return Ok(());
        };
        let result = self.drain_ring(vm, &mut ring, mem, r);
        self.vms[vm].ring = Some(ring);
        result
    }

    fn drain_ring(
        &mut self,
        vm: usize,
        ring: &mut Consumer,
        mem: &mut GuestMemory,
        r: &mut TurnReport,
    ) -> Result<(), MemError> {
        while r.taken < self.params.ring_budget {
            let Some(index) = ring.peek(mem)? else {
                break;
            };
            let Some(gpa) = ring.layout.inr_gpa(index) else {
                ring.consume(mem, Errno::Einval.ret() as i32)?;
                r.taken += 1;
                r.refused += 1;
                continue;
            };
            // The one read of this INR: from here on only the copy counts.
            let mut bytes = [0u8; INR_SIZE];
            mem.read(gpa, &mut bytes)?;
            let copy = Inr::decode(&bytes);
            if copy.state != INR_REQUESTED {
                ring.consume(mem, Errno::Ebusy.ret() as i32)?;
                r.taken += 1;
                r.refused += 1;
                continue;
            }
            match self.check(mem, &copy) {
                Err(e) => {
                    ring.consume(mem, 0)?;
                    r.taken += 1;
                    r.rejected += 1;
                    r.irqs += answer(mem, gpa, e.ret(), None)? as u32;
                }
                Ok(call) => {
                    let class = class_of(call.call_type());
                    if self.sched.is_full(vm, class) {
                        r.blocked = true;
                        break;
                    }
                    ring.consume(mem, 0)?;
                    r.taken += 1;
                    mem.write_u32(gpa + off::STATE, INR_IN_SERVICE)?;
                    // Cannot fail: checked for room above.
                    let _ = self.sched.push(vm, class, Queued { inr: index, call });
                    r.queued += 1;
                }
            }
        }
        Ok(())
    }

    /// The checks of an INR copy that need no socket state: its call and
    /// arguments, its indices within the socket array, its buffer inside
    /// guest RAM, its counts within the array's size.
    fn check(&self, mem: &GuestMemory, inr: &Inr) -> Result<InrCall, Errno> {
        let call = InrCall::from_inr(inr)?;
        let n = self.params.sockets_per_vm;
        let target = match call {
            Call::EpollCtl { fd, .. } => Some(fd),
            _ => None,
        };
        if call.fd().into_iter().chain(target).any(|i| i >= n) {
            return Err(Errno::Ebadf);
        }
        if let Some(b) = call.buf() {
            if b.len > 0 {
                mem.check_ram(b.addr, b.len).map_err(|_| Errno::Efault)?;
            }
        }
        match call {
            Call::Select { nfds, .. } | Call::Poll { nfds, .. } if nfds > n => Err(Errno::Einval),
            _ => Ok(call),
        }
    }

    /// Issues `vm`'s queued calls for this turn.
    fn serve(
        &mut self,
        vm: usize,
        mem: &mut GuestMemory,
        idle: usize,
        issue: &mut impl FnMut(Dispatch),
        r: &mut TurnReport,
    ) -> Result<(), MemError> {
        let Some(ring) = self.vms[vm].ring else {
            return Ok(());
        };
        while (r.issued as usize) < idle {
            let Some((_, q)) = self.sched.next_in_turn() else {
                break;
            };
            match self.resolve(vm, q) {
                Ok(d) => {
                    r.translations += d.host_port.is_some() as u32;
                    r.issued += 1;
                    issue(d);
                }
                Err(e) => {
                    r.rejected += 1;
                    // In the pool: checked when queued.
                    if let Some(gpa) = ring.layout.inr_gpa(q.inr) {
                        r.irqs += answer(mem, gpa, e.ret(), None)? as u32;
                    }
                }
            }
        }
        Ok(())
    }

    /// The open socket at `index` of `vm`'s array, with its kind.
    fn open(&self, vm: usize, index: u32) -> Result<(HostSocket, SlotKind, Option<u16>), Errno> {
        match self.vms[vm].sockets.get(index as usize) {
            Some(&Slot::Open { host, kind, port }) => Ok((host, kind, port)),
            _ => Err(Errno::Ebadf),
        }
    }

    /// Resolves a queued call against `vm`'s socket array now, holding
    /// what it needs (a new index, a host port).
    fn resolve(&mut self, vm: usize, q: Queued) -> Result<Dispatch, Errno> {
        let call = q.call;
        let mut d = Dispatch {
            vm,
            inr: q.inr,
            call,
            socket: None,
            kind: None,
            target: None,
            new_slot: None,
            host_port: None,
        };
        let mut kind = None;
        if let Some(i) = call.fd() {
            let (host, k, port) = self.open(vm, i)?;
            let epoll_call = matches!(call.call_type(), CallType::EpollCtl | CallType::EpollWait);
            match (epoll_call, k == SlotKind::Epoll) {
                (true, false) => return Err(Errno::Einval),
                (false, true) => return Err(Errno::Enotsock),
                _ => {}
            }
            d.socket = Some(host);
            d.kind = Some(k);
            kind = Some((k, port));
        }
        match (call, kind) {
            (Call::EpollCtl { fd, .. }, _) => match self.open(vm, fd)? {
                (_, SlotKind::Epoll, _) => return Err(Errno::Einval),
                (host, _, _) => d.target = Some(host),
            },
            (Call::Listen { .. } | Call::Accept { .. }, Some((SlotKind::Dgram, _))) => {
                return Err(Errno::Eopnotsupp)
            }
            (Call::Bind { .. }, Some((_, Some(_)))) => return Err(Errno::Einval),
            (Call::Bind { addr, .. }, Some((k, None))) => {
                d.host_port = Some(self.translator(k).bind(GuestAddr { vm, addr })?);
            }
            _ => {}
        }
        let new_kind = match call {
            Call::Socket {
                ty: SockType::Stream,
                ..
            }
            | Call::Accept { .. } => Some(SlotKind::Stream),
            Call::Socket {
                ty: SockType::Dgram,
                ..
            } => Some(SlotKind::Dgram),
            Call::EpollCreate => Some(SlotKind::Epoll),
            _ => None,
        };
        if let Some(k) = new_kind {
            let sockets = &mut self.vms[vm].sockets;
            let i = sockets
                .iter()
                .position(|s| *s == Slot::Free)
                .ok_or(Errno::Emfile)?;
            sockets[i] = Slot::Reserved;
            d.new_slot = Some((i as u32, k));
        }
        Ok(d)
    }

    /// The translator for sockets of `kind`.
    fn translator(&mut self, kind: SlotKind) -> &mut Translator {
        if kind == SlotKind::Dgram {
            &mut self.udp
        } else {
            &mut self.tcp
        }
    }

    /// A pool thread finished `d` with `outcome` (and, for accept() and
    /// recvfrom(), the peer's address): updates `d.vm`'s socket array,
    /// writes the result into the INR (`mem` is that VM's memory) and
    /// returns whether the waiter asked for a completion interrupt, which
    /// the caller then delivers through the active scheme.
    pub fn complete(
        &mut self,
        d: &Dispatch,
        outcome: Outcome,
        peer: Option<SockAddr>,
        mem: &mut GuestMemory,
    ) -> Result<bool, ServiceError> {
        let vm = d.vm;
        let gpa = self
            .vms
            .get(vm)
            .and_then(|v| v.ring)
            .and_then(|c| c.layout.inr_gpa(d.inr))
            .ok_or(ServiceError::NoVm(vm))?;
        let ret = self.settle(d, outcome);
        let out_addr = match d.call {
            Call::Accept { .. } => peer.map(|a| (0, a)),
            Call::RecvFrom { .. } => peer.map(|a| (1, a)),
            _ => None,
        }
        .filter(|_| ret >= 0);
        let irq = answer(mem, gpa, ret, out_addr)?;
        let s = &mut self.vms[vm].stats;
        s.completed += 1;
        s.irqs += irq as u64;
        Ok(irq)
    }

    /// Applies `outcome` to the socket array and translators; the `ret`
    /// to write. An outcome of the wrong shape (a new socket for a call
    /// that makes none, or none for one that does) is EINVAL.
    fn settle(&mut self, d: &Dispatch, outcome: Outcome) -> i64 {
        let vm = d.vm;
        let index = d.call.fd().unwrap_or(0) as usize;
        let still_open = |s: &Self| match s.vms[vm].sockets.get(index) {
            Some(&Slot::Open { host, kind, port }) if Some(host) == d.socket => Some((kind, port)),
            _ => None,
        };
        if let Some((i, kind)) = d.new_slot {
            let slot = &mut self.vms[vm].sockets[i as usize];
            return match outcome {
                Outcome::NewSocket(host) => {
                    *slot = Slot::Open {
                        host,
                        kind,
                        port: None,
                    };
                    i as i64
                }
                Outcome::Failed(e) => {
                    *slot = Slot::Free;
                    e.ret()
                }
                Outcome::Value(_) => {
                    *slot = Slot::Free;
                    Errno::Einval.ret()
                }
            };
        }
        let v = match outcome {
            Outcome::Value(v) => v.min(i64::MAX as u64) as i64,
            Outcome::NewSocket(_) => Errno::Einval.ret(),
            Outcome::Failed(e) => e.ret(),
        };
        match d.call {
            Call::Bind { .. } => {
                if let (Some(port), Some(kind)) = (d.host_port, d.kind) {
                    // Keep the port only if the bind worked and the socket
                    // is still the one bound, and still unbound.
                    if v >= 0 && matches!(still_open(self), Some((_, None))) {
                        if let Slot::Open { port: p, .. } = &mut self.vms[vm].sockets[index] {
                            *p = Some(port);
                        }
                    } else {
                        self.translator(kind).release(port);
                    }
                }
            }
            Call::Close { .. } if v >= 0 => {
                if let Some((kind, port)) = still_open(self) {
                    if let Some(p) = port {
                        self.translator(kind).release(p);
                    }
                    self.vms[vm].sockets[index] = Slot::Free;
                }
            }
            _ => {}
        }
        v
    }
}

#[cfg(test)]
mod tests;
