//! An event-loop HTTP server over vCanal sockets (vcanal.md §4: "the VM
//! is an HTTP server with 2 concurrent threads; remote ApacheBench
//! repeatedly requests 4 KB pages"), written against libCanal as
//! [`super::http::HttpWorker`] is against the guest kernel.
//!
//! Each server thread is an epoll loop (nginx's shape: one listening
//! socket per thread on its own port, the ab connections split between
//! them as [`super::http::ab_process_of`] splits them):
//! `socket` → `bind` → `listen` → `epoll_create` → `epoll_ctl(ADD,
//! listener)`, then forever `epoll_wait`; for each ready index either
//! `accept` + `epoll_ctl(ADD, new)`, or a non-blocking `recv` and, for
//! each whole request, the server's work and a `send` of the response
//! (repeated while the host's send buffer takes only part of it).
//! Without keep-alive (ab's default) the response is followed by `close`
//! (HTTP/1.0: the server closes first), which frees the socket-array
//! index and takes the connection off the epoll set; the next request
//! comes on a new connection, accepted again.
//!
//! Every call is an INR through the VM's channel (no exit); `accept`,
//! `epoll_wait` and a blocking `send` wait on the host's stack in a
//! network-pool thread (`world::vcanal`). `epoll_wait` returns its ready
//! list as `epoll_event` records the host writes into the thread's event
//! buffer in guest memory; the thread reads them from there. The two
//! threads share one libCanal (one process: one dummy-fd table, one INR
//! pool, one hybrid address space).

use super::vcanal::{CallWait, CanalAppCosts, CanalCaller, BUF_GPA, BUF_GVA};
use crate::engine::Time;
use crate::guest::app::{App, Metrics, Sys, TaskStep};
use crate::guest::libcanal::inr::{Buf, Call, Errno, SockAddr, SockType, EPOLL_EVENT_SIZE};
use crate::guest::libcanal::{Completion, LibCanal};
use crate::hw::guest_memory::GuestMemory;
use std::cell::RefCell;
use std::rc::Rc;

/// The port server thread 0 listens on (thread j: `HTTP_PORT + j`).
pub const HTTP_PORT: u16 = 80;

/// `MSG_DONTWAIT` (Linux x86-64): a recv that finds nothing fails with
/// EAGAIN instead of waiting (nginx's sockets are non-blocking).
pub const MSG_DONTWAIT: u32 = 0x40;

/// `EPOLLIN`.
pub const EPOLLIN: u32 = 0x1;

/// `EPOLL_CTL_ADD`.
pub const EPOLL_CTL_ADD: u8 = 1;

/// Events one `epoll_wait` returns at most (nginx's default is 512; the
/// server here has few connections, so fewer do).
pub const MAX_EVENTS: usize = 32;

/// Bytes of one thread's event buffer.
const EVENTS_BYTES: u64 = MAX_EVENTS as u64 * EPOLL_EVENT_SIZE;

/// Where thread j's epoll event buffer lies in the process's address
/// space (`EVENTS_GVA + j * 4 KiB`), above the data buffer's 16 MiB.
pub const EVENTS_GVA: u64 = BUF_GVA + (1 << 24);

/// Socket-array indices the server's tables cover (the host's array is
/// Linux's default fd limit long, `ServiceParams::sockets_per_vm`).
const MAX_INDEX: usize = 1024;

/// Server threads at most (one event page each).
pub const MAX_THREADS: usize = 16;

/// The guest's page walk for the server's buffers (the helper driver's
/// GVA → GPA, vcanal.md §2.6): the data buffer as [`super::vcanal::walk`],
/// and thread j's event page to `events_gpa + j * 4 KiB`, a page the
/// host can write (`events_gpa`: where the world backs them).
pub fn walk(events_gpa: u64) -> impl Fn(u64) -> Option<u64> {
    move |page| {
        if let Some(off) = page.checked_sub(EVENTS_GVA) {
            if off < MAX_THREADS as u64 * 4096 {
                return Some(events_gpa + off);
            }
        }
        let off = page.checked_sub(BUF_GVA)?;
        (off < 1 << 24).then_some(BUF_GPA + off)
    }
}

/// The server's shape.
#[derive(Clone, Copy, Debug)]
pub struct CanalHttpShape {
    /// Request bytes.
    pub request: u32,
    /// Response bytes (header and page).
    pub response: u32,
    /// The server's own work per request (parse, lookup, header build,
    /// logging): the calibration's, as for the kernel-socket server.
    pub work: Time,
    /// Connections carry request after request (ab -k); otherwise the
    /// server closes each after its response.
    pub keep_alive: bool,
    /// The server's own work per connection without keep-alive (set-up
    /// at accept, tear-down at close).
    pub connection: Time,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Socket,
    Bind,
    Listen,
    EpollCreate,
    AddListener,
    Wait,
    /// Take the next ready index.
    Next,
    Accept,
    /// Add the connection just accepted (its dummy fd).
    AddConn(i32),
    Recv(i32),
    /// The response's bytes still to send on this fd.
    Send(i32, u32),
    /// Close the connection (fd, its socket-array index).
    Close(i32, usize),
}

/// One server thread.
pub struct CanalHttpThread {
    lib: Rc<RefCell<LibCanal>>,
    thread: usize,
    shape: CanalHttpShape,
    costs: CanalAppCosts,
    events_gpa: u64,
    next: Step,
    caller: CanalCaller,
    listen: i32,
    listen_index: u32,
    epfd: i32,
    /// The ready list of the last `epoll_wait` and how far it is taken.
    ready: [u32; MAX_EVENTS],
    ready_len: usize,
    ready_pos: usize,
    /// Per socket-array index: its dummy fd (-1: none) and the request
    /// bytes received and not yet served.
    fd_of: Vec<i32>,
    got: Vec<u32>,
    served: u64,
    errors: u64,
    accepted: u64,
    waits: u64,
}

impl CanalHttpThread {
    /// Server thread `thread` over the process's libCanal; its event page
    /// is backed at `events_gpa + thread * 4 KiB`.
    pub fn new(
        lib: Rc<RefCell<LibCanal>>,
        thread: usize,
        shape: CanalHttpShape,
        costs: CanalAppCosts,
        events_gpa: u64,
    ) -> Self {
        CanalHttpThread {
            lib,
            thread,
            shape,
            costs,
            events_gpa,
            next: Step::Socket,
            caller: CanalCaller::default(),
            listen: -1,
            listen_index: u32::MAX,
            epfd: -1,
            ready: [0; MAX_EVENTS],
            ready_len: 0,
            ready_pos: 0,
            fd_of: vec![-1; MAX_INDEX],
            got: vec![0; MAX_INDEX],
            served: 0,
            errors: 0,
            accepted: 0,
            waits: 0,
        }
    }

    fn events_gva(&self) -> u64 {
        EVENTS_GVA + self.thread as u64 * 4096
    }

    /// The call for `self.next`, or None when the step makes no call.
    fn call(&self) -> Option<Call<i32>> {
        let data = |len: u32| Buf {
            addr: BUF_GVA,
            len: u64::from(len),
        };
        Some(match self.next {
            Step::Socket => Call::Socket {
                ty: SockType::Stream,
                protocol: 0,
            },
            Step::Bind => Call::Bind {
                fd: self.listen,
                addr: SockAddr {
                    ip: 0,
                    port: HTTP_PORT + self.thread as u16,
                },
            },
            Step::Listen => Call::Listen {
                fd: self.listen,
                backlog: 511,
            },
            Step::EpollCreate => Call::EpollCreate,
            Step::AddListener => Call::EpollCtl {
                epfd: self.epfd,
                op: EPOLL_CTL_ADD,
                fd: self.listen,
                events: EPOLLIN,
            },
            Step::AddConn(fd) => Call::EpollCtl {
                epfd: self.epfd,
                op: EPOLL_CTL_ADD,
                fd,
                events: EPOLLIN,
            },
            Step::Wait => Call::EpollWait {
                epfd: self.epfd,
                events: Buf {
                    addr: self.events_gva(),
                    len: EVENTS_BYTES,
                },
                maxevents: MAX_EVENTS as u32,
                timeout_ms: -1,
            },
            Step::Accept => Call::Accept { fd: self.listen },
            Step::Recv(fd) => Call::Recv {
                fd,
                buf: data(self.shape.request.max(1024)),
                flags: MSG_DONTWAIT,
            },
            Step::Send(fd, left) => Call::Send {
                fd,
                buf: data(left),
                flags: 0,
            },
            Step::Close(fd, _) => Call::Close { fd },
            Step::Next => return None,
        })
    }

    /// The socket-array index of dummy fd `fd`.
    fn index_of(&self, fd: i32) -> Option<usize> {
        let i = self.lib.borrow().driver.index(fd)? as usize;
        (i < MAX_INDEX).then_some(i)
    }

    /// Reads the `n` events the host wrote into the event page.
    fn read_events(&mut self, mem: &GuestMemory, n: usize) {
        let base = self.events_gpa + self.thread as u64 * 4096;
        self.ready_len = 0;
        self.ready_pos = 0;
        for k in 0..n.min(MAX_EVENTS) {
            let at = base + k as u64 * EPOLL_EVENT_SIZE;
            // epoll_event: u32 events, then the u64 data (packed).
            let Ok(data) = mem.read_u64(at + 4) else {
                self.errors += 1;
                return;
            };
            self.ready[self.ready_len] = data.min(u64::from(u32::MAX)) as u32;
            self.ready_len += 1;
        }
    }

    /// The call made for `self.next` finished: what comes next, and CPU
    /// time the server spends before it.
    fn done(&mut self, c: Completion, mem: &GuestMemory) -> Time {
        let ret = match c.ret {
            Ok(v) => v,
            Err(e) => {
                if e != Errno::Eagain {
                    self.errors += 1;
                }
                // Setup calls are retried; data calls give up on the
                // connection for now (level-triggered epoll reports it
                // again while it has data).
                if matches!(
                    self.next,
                    Step::Recv(_)
                        | Step::Send(..)
                        | Step::Accept
                        | Step::AddConn(_)
                        | Step::Close(..)
                ) {
                    self.next = Step::Next;
                }
                return 0;
            }
        };
        let mut work = 0;
        self.next = match self.next {
            Step::Socket => {
                self.listen = ret as i32;
                if let Some(i) = self.index_of(self.listen) {
                    self.listen_index = i as u32;
                }
                Step::Bind
            }
            Step::Bind => Step::Listen,
            Step::Listen => Step::EpollCreate,
            Step::EpollCreate => {
                self.epfd = ret as i32;
                Step::AddListener
            }
            Step::AddListener | Step::AddConn(_) => Step::Next,
            Step::Wait => {
                self.waits += 1;
                self.read_events(mem, ret.max(0) as usize);
                Step::Next
            }
            Step::Accept => {
                let fd = ret as i32;
                if let Some(i) = self.index_of(fd) {
                    self.fd_of[i] = fd;
                    self.got[i] = 0;
                }
                self.accepted += 1;
                if !self.shape.keep_alive {
                    work += self.shape.connection;
                }
                Step::AddConn(fd)
            }
            Step::Recv(fd) => match self.index_of(fd) {
                Some(i) if ret > 0 => {
                    self.got[i] = self.got[i].saturating_add(ret as u32);
                    self.respond(i, fd, &mut work)
                }
                _ => Step::Next,
            },
            Step::Send(fd, left) => {
                let left = left.saturating_sub(ret as u32);
                if left > 0 {
                    Step::Send(fd, left)
                } else {
                    self.served += 1;
                    match self.index_of(fd) {
                        Some(i) if !self.shape.keep_alive => Step::Close(fd, i),
                        Some(i) => self.respond(i, fd, &mut work),
                        None => Step::Next,
                    }
                }
            }
            Step::Close(_, i) => {
                // libCanal unmapped the dummy fd; the index is free.
                self.fd_of[i] = -1;
                self.got[i] = 0;
                Step::Next
            }
            Step::Next => Step::Next,
        };
        work
    }

    /// With a whole request received on index `i`: the server's work and
    /// the response; otherwise the next ready index.
    fn respond(&mut self, i: usize, fd: i32, work: &mut Time) -> Step {
        if self.got[i] >= self.shape.request {
            self.got[i] -= self.shape.request;
            *work += self.shape.work;
            Step::Send(fd, self.shape.response)
        } else {
            Step::Next
        }
    }

    /// Takes the next ready index: the step for it.
    fn take_ready(&mut self) -> Step {
        while self.ready_pos < self.ready_len {
            let i = self.ready[self.ready_pos];
            self.ready_pos += 1;
            if i == self.listen_index {
                return Step::Accept;
            }
            match self.fd_of.get(i as usize) {
                Some(&fd) if fd >= 0 => return Step::Recv(fd),
                // Not one of ours (a bad or stale event): skipped.
                _ => self.errors += 1,
            }
        }
        Step::Wait
    }
}

impl App for CanalHttpThread {
    fn step(&mut self, sys: &mut Sys) -> TaskStep {
        let Some(mem) = sys.shared.as_deref_mut() else {
            return TaskStep::Exit;
        };
        let c = self.costs.canal;
        let wait = self
            .caller
            .wait(&mut self.lib.borrow_mut(), mem, &self.costs);
        match wait {
            CallWait::Done(done) => {
                let work = self.done(done, mem);
                if work > 0 {
                    return TaskStep::Compute(work);
                }
            }
            CallWait::Step(step) => return step,
            CallWait::Idle => {}
        }
        if self.next == Step::Next {
            self.next = self.take_ready();
        }
        let Some(call) = self.call() else {
            return TaskStep::Compute(c.completion_poll);
        };
        let walk = walk(self.events_gpa);
        self.caller
            .submit(&mut self.lib.borrow_mut(), mem, call, walk, &self.costs)
    }

    fn reset_metrics(&mut self) {
        self.served = 0;
        self.caller.reset_counts();
        self.errors = 0;
        self.accepted = 0;
        self.waits = 0;
    }

    fn metrics(&self, out: &mut Metrics) {
        out.insert(
            format!("nginx.served.worker{}", self.thread),
            self.served as f64,
        );
        let mut add = |k: &str, v: u64| *out.entry(k.into()).or_insert(0.0) += v as f64;
        add("vcanal.calls", self.caller.calls);
        add("vcanal.sleeps", self.caller.sleeps);
        add("vcanal.page_walks", self.caller.misses);
        add("vcanal.call_errors", self.errors);
        add("vcanal.accepts", self.accepted);
        add("vcanal.epoll_waits", self.waits);
    }
}
