//! libCanal, vCanal's guest user-level library (vcanal.md §2.1–§2.6), and
//! the helper driver's services it uses.
//!
//! A call on an `AF_VSOCKET` socket becomes an INR ([`inr`]): libCanal maps
//! the application's dummy fd to its host socket-array index, translates
//! buffer addresses GVA → GPA through the hybrid address space ([`radix`]),
//! takes an INR from the pool, fills it and enqueues its index on the VM's
//! channel ring ([`crate::hv::vcanal::channel`]) — no exit. It then waits
//! on the INR's `state` ([`LibCanal::wait`]): a poll per step up to the
//! poll budget, then it asks for a completion interrupt and sleeps.
//!
//! Several guest threads share one `LibCanal` (one process's library over
//! the VM's channel); each call is one simulated step, and the ring's
//! claim/publish split lets threads interleave where it matters.

pub mod inr;
pub mod radix;

use crate::hv::vcanal::channel::{self, ChannelLayout, RingError};
use crate::hw::guest_memory::{GuestMemory, MemError};
use inr::{off, Buf, Call, CallType, Errno, Inr, InrCall, SockAddr, INR_COMPLETED, INR_SIZE};
use radix::GvaCache;

/// Polls of the completion flag before interrupt mode: "futex-style count
/// of polls, default 100" (vcanal.md §2.5, §3.4).
pub const DEFAULT_POLL_BUDGET: u32 = 100;

/// libCanal's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibCanalParams {
    /// Failed polls of an INR's `state` before the waiter asks for an
    /// interrupt ([`DEFAULT_POLL_BUDGET`]). The paper's measured variants
    /// (§2.5): 0 is interrupt-only (one check, then arm), `u32::MAX`
    /// polling-only, the default switching.
    pub poll_budget: u32,
    /// First dummy fd number the helper driver hands out.
    pub first_dummy_fd: i32,
    /// Dummy fds it can have out at once.
    pub max_dummy_fds: u32,
    /// Nodes of the radix cache (4 KiB each).
    pub cache_nodes: usize,
}

impl Default for LibCanalParams {
    /// The paper's poll budget; fds after stdio up to Linux's default
    /// limit; a 64-node (256 KiB) cache, enough for 32 distant 2 MiB
    /// regions of buffers.
    fn default() -> Self {
        Self {
            poll_budget: DEFAULT_POLL_BUDGET,
            first_dummy_fd: 3,
            max_dummy_fds: 1021,
            cache_nodes: 64,
        }
    }
}

/// One dummy fd's state in the helper driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DummyFd {
    Free,
    /// Handed out for a socket()/accept()/epoll_create() in flight.
    Issued,
    /// Stands for this host socket-array index.
    Mapped(u32),
}

/// The helper driver's dummy fds (§2.2): real guest fds that stand for
/// host sockets, mapped to the VM's socket-array indices.
#[derive(Clone, Debug)]
pub struct HelperDriver {
    first: i32,
    fds: Vec<DummyFd>,
}

impl HelperDriver {
    /// Fds `first ..` up to `max` of them.
    pub fn new(first: i32, max: u32) -> Self {
        Self {
            first,
            fds: vec![DummyFd::Free; max as usize],
        }
    }

    fn slot(&self, fd: i32) -> Option<usize> {
        let i = usize::try_from(fd.checked_sub(self.first)?).ok()?;
        (i < self.fds.len()).then_some(i)
    }

    /// Hands out a dummy fd (EMFILE when none is free).
    pub fn open(&mut self) -> Result<i32, Errno> {
        let i = self
            .fds
            .iter()
            .position(|f| *f == DummyFd::Free)
            .ok_or(Errno::Emfile)?;
        self.fds[i] = DummyFd::Issued;
        Ok(self.first + i as i32)
    }

    /// Maps `fd` to socket-array `index`.
    pub fn map(&mut self, fd: i32, index: u32) {
        if let Some(i) = self.slot(fd) {
            self.fds[i] = DummyFd::Mapped(index);
        }
    }

    /// The socket-array index `fd` stands for.
    pub fn index(&self, fd: i32) -> Option<u32> {
        match self.fds[self.slot(fd)?] {
            DummyFd::Mapped(i) => Some(i),
            _ => None,
        }
    }

    /// Gives `fd` back.
    pub fn release(&mut self, fd: i32) {
        if let Some(i) = self.slot(fd) {
            self.fds[i] = DummyFd::Free;
        }
    }
}

/// Why a call could not be submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The call fails in the guest with this errno (unknown fd, unmapped
    /// buffer, no dummy fd left).
    #[error("errno {0:?}")]
    Errno(Errno),
    /// Every INR is in flight: spin and retry.
    #[error("INR pool exhausted")]
    NoInr,
    /// The ring is full: spin and retry (§7).
    #[error("ring full")]
    RingFull,
    /// The channel is not in guest memory.
    #[error("{0}")]
    Mem(MemError),
}

impl From<RingError> for SubmitError {
    fn from(e: RingError) -> Self {
        match e {
            RingError::Mem(m) => SubmitError::Mem(m),
            RingError::Full | RingError::Inconsistent => SubmitError::RingFull,
        }
    }
}

/// Fd bookkeeping to do when a call completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    Nothing,
    /// Map this dummy fd to the returned index (or release it on error).
    MapNew(i32),
    /// Release this dummy fd.
    Unmap(i32),
}

/// A submitted call being waited for (made only by [`LibCanal::submit`],
/// so its INR index is always one of the pool's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    inr: u32,
    call: CallType,
    polls: u32,
    irq_mode: bool,
    after: After,
}

impl Pending {
    /// Its INR (pool index).
    pub fn inr(&self) -> u32 {
        self.inr
    }

    /// Its call type.
    pub fn call(&self) -> CallType {
        self.call
    }

    /// Failed polls so far.
    pub fn polls(&self) -> u32 {
        self.polls
    }

    /// Whether the waiter asked for a completion interrupt.
    pub fn irq_mode(&self) -> bool {
        self.irq_mode
    }
}

/// A submission, with the hybrid address space's outcomes to charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// What to wait on.
    pub pending: Pending,
    /// Buffer pages found in the cache.
    pub hits: u32,
    /// Buffer pages the helper driver walked.
    pub misses: u32,
    /// Bytes the INR carries (a data call's buffer may be cut at a GPA
    /// discontinuity: a short transfer).
    pub buf_len: u64,
}

/// A finished call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The value (a dummy fd for socket/accept/epoll_create) or the error.
    pub ret: Result<i64, Errno>,
    /// accept()/recvfrom(): the peer.
    pub peer: Option<SockAddr>,
}

/// One step of waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStep {
    /// The call finished.
    Done(Completion),
    /// Not yet: poll again (one poll spent).
    Spin,
    /// The poll budget is spent: `want_irq` is now set. Arm the completion
    /// interrupt through the helper driver, then step again to re-check
    /// before sleeping (§7).
    ArmInterrupt,
    /// Interrupt mode and not done: sleep until the completion interrupt.
    Sleep,
}

/// One VM's libCanal.
#[derive(Clone, Debug)]
pub struct LibCanal {
    params: LibCanalParams,
    layout: ChannelLayout,
    free_inrs: Vec<u32>,
    /// The helper driver's dummy fds.
    pub driver: HelperDriver,
    /// The hybrid address space.
    pub cache: GvaCache,
}

/// Whether a call's buffer may be cut short (a stream or datagram
/// transfer may move fewer bytes; a struct may not be cut).
fn may_shorten(t: CallType) -> bool {
    matches!(
        t,
        CallType::Send | CallType::Recv | CallType::SendTo | CallType::RecvFrom
    )
}

impl LibCanal {
    /// The library over the channel at `layout`, which the helper driver
    /// has initialised and announced.
    pub fn new(params: LibCanalParams, layout: ChannelLayout) -> Self {
        Self {
            free_inrs: (0..layout.pool_len).rev().collect(),
            driver: HelperDriver::new(params.first_dummy_fd, params.max_dummy_fds),
            cache: GvaCache::new(params.cache_nodes),
            params,
            layout,
        }
    }

    /// INRs not in flight.
    pub fn free_inrs(&self) -> usize {
        self.free_inrs.len()
    }

    /// The channel's layout.
    pub fn layout(&self) -> ChannelLayout {
        self.layout
    }

    /// Builds the INR for `call` (dummy fds, GVA buffers), translating its
    /// buffer with `walk(gva_page) -> gpa_page` on cache misses (the
    /// helper driver's page walk), and enqueues it.
    pub fn submit(
        &mut self,
        mem: &mut GuestMemory,
        call: Call<i32>,
        walk: impl FnMut(u64) -> Option<u64>,
    ) -> Result<Submitted, SubmitError> {
        let after = match call {
            Call::Socket { .. } | Call::Accept { .. } | Call::EpollCreate => {
                After::MapNew(self.driver.open().map_err(SubmitError::Errno)?)
            }
            Call::Close { fd } => After::Unmap(fd),
            _ => After::Nothing,
        };
        let r = self.build_and_enqueue(mem, call, walk, after);
        if let (Err(_), After::MapNew(fd)) = (&r, after) {
            self.driver.release(fd);
        }
        r
    }

    fn build_and_enqueue(
        &mut self,
        mem: &mut GuestMemory,
        call: Call<i32>,
        mut walk: impl FnMut(u64) -> Option<u64>,
        after: After,
    ) -> Result<Submitted, SubmitError> {
        let ty = call.call_type();
        let (mut hits, mut misses) = (0, 0);
        let driver = &self.driver;
        let cache = &mut self.cache;
        let lowered: InrCall = call
            .map(
                |fd| driver.index(fd).ok_or(Errno::Ebadf),
                |b| {
                    let t =
                        radix::translate(cache, b.addr, b.len, &mut walk).ok_or(Errno::Efault)?;
                    hits += t.hits;
                    misses += t.misses;
                    if t.len < b.len && !may_shorten(ty) {
                        return Err(Errno::Efault);
                    }
                    Ok(Buf {
                        addr: t.gpa,
                        len: t.len,
                    })
                },
            )
            .map_err(SubmitError::Errno)?;
        let inr = self.free_inrs.pop().ok_or(SubmitError::NoInr)?;
        let gpa = self.inr_gpa(inr);
        let bytes = lowered.to_inr(inr as u64).encode();
        let sent = mem
            .write(gpa, &bytes)
            .map_err(SubmitError::Mem)
            .and_then(|()| Ok(channel::enqueue(mem, &self.layout, inr)?));
        if let Err(e) = sent {
            self.free_inrs.push(inr);
            return Err(e);
        }
        Ok(Submitted {
            pending: Pending {
                inr,
                call: ty,
                polls: 0,
                irq_mode: false,
                after,
            },
            hits,
            misses,
            buf_len: lowered.buf().map_or(0, |b| b.len),
        })
    }

    /// GPA of INR `inr`: one of the pool's, since indices come only from
    /// our own free list (a [`Pending`] is made only by `submit`).
    fn inr_gpa(&self, inr: u32) -> u64 {
        self.layout.inr_gpa(inr).unwrap_or(self.layout.base)
    }

    /// One step of waiting for `p` (§2.5): a poll of its `state`; done, or
    /// spin, or once `poll_budget` polls failed ask for an interrupt, or
    /// (in interrupt mode) sleep.
    pub fn wait(&mut self, mem: &mut GuestMemory, p: &mut Pending) -> Result<WaitStep, MemError> {
        let gpa = self.inr_gpa(p.inr);
        if mem.read_u32(gpa + off::STATE)? == INR_COMPLETED {
            return self.finish(mem, p).map(WaitStep::Done);
        }
        if p.irq_mode {
            return Ok(WaitStep::Sleep);
        }
        p.polls = p.polls.saturating_add(1);
        if p.polls < self.params.poll_budget {
            return Ok(WaitStep::Spin);
        }
        mem.write_u32(gpa + off::WANT_IRQ, 1)?;
        p.irq_mode = true;
        Ok(WaitStep::ArmInterrupt)
    }

    /// Reads the result of a completed INR, frees the INR and does the
    /// fd bookkeeping.
    fn finish(&mut self, mem: &mut GuestMemory, p: &Pending) -> Result<Completion, MemError> {
        let gpa = self.inr_gpa(p.inr);
        let mut bytes = [0u8; INR_SIZE];
        mem.read(gpa, &mut bytes)?;
        let done = Inr::decode(&bytes);
        mem.write(gpa, &Inr::default().encode())?;
        self.free_inrs.push(p.inr);
        let ret = if done.ret >= 0 {
            Ok(done.ret)
        } else {
            Err(Errno::from_ret(done.ret).unwrap_or(Errno::Einval))
        };
        let peer_at = match p.call {
            CallType::Accept => Some(0),
            CallType::RecvFrom => Some(1),
            _ => None,
        };
        let peer = peer_at.filter(|_| ret.is_ok()).map(|i| SockAddr {
            ip: done.params[i] as u32,
            port: done.params[i + 1] as u16,
        });
        let ret = match p.after {
            After::MapNew(fd) => match ret {
                Ok(index) => {
                    self.driver.map(fd, index as u32);
                    Ok(fd as i64)
                }
                Err(e) => {
                    self.driver.release(fd);
                    Err(e)
                }
            },
            After::Unmap(fd) => {
                // close() releases the fd whatever the host said.
                self.driver.release(fd);
                ret
            }
            After::Nothing => ret,
        };
        Ok(Completion { ret, peer })
    }
}

#[cfg(test)]
mod tests;
