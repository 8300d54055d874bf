//! The intermediate network request (INR, vcanal.md §2.2): one socket call
//! as a fixed binary record in the channel's INR pool, shared by libCanal
//! (which fills it) and the host service (which copies it once, executes
//! it and writes the result back).
//!
//! # Layout (little-endian, [`INR_SIZE`] = 80 bytes)
//!
//! | offset | size | field | written by |
//! |---|---|---|---|
//! | 0x00 | u32 | `state`: 0 FREE, 1 REQUESTED, 2 IN_SERVICE, 3 COMPLETED | guest (FREE, REQUESTED), host (IN_SERVICE, COMPLETED) |
//! | 0x04 | u32 | `want_irq`: 1 = the waiter switched to interrupt mode (§2.5, §7) | guest |
//! | 0x08 | u16 | `call`: [`CallType`] | guest |
//! | 0x0a | u16 | reserved (guest writes 0, host ignores) | guest |
//! | 0x0c | u32 | `fd`: index into the VM's host socket array (§3.5) | guest |
//! | 0x10 | 4 × u64 | `params[0..4]`: the call's scalar arguments (table below) | guest; host for out-parameters |
//! | 0x30 | u64 | `buf_gpa`: guest-physical address of the call's buffer | guest |
//! | 0x38 | u64 | `buf_len`: its length in bytes | guest |
//! | 0x40 | i64 | `ret`: return value, `-errno` on failure ([`Errno`]) | host |
//! | 0x48 | u64 | `cookie`: the guest's own tag, never read by the host | guest |
//!
//! # Parameters by call (`fd` = a socket-array index; `[out]` = host writes)
//!
//! | call | fd | p0 | p1 | p2 | p3 | buffer |
//! |---|---|---|---|---|---|---|
//! | Socket | – | type (1 stream, 2 dgram) | protocol (0, 6, 17) | | | – |
//! | Bind | socket | IPv4 | port | | | – |
//! | Listen | socket | backlog | | | | – |
//! | Accept | socket | [out] peer IPv4 | [out] peer port | | | – |
//! | Connect | socket | IPv4 | port | | | – |
//! | Send / Recv | socket | flags | | | | data |
//! | SendTo | socket | flags | IPv4 | port | | data |
//! | RecvFrom | socket | flags | [out] IPv4 | [out] port | | data |
//! | Shutdown | socket | how (0..=2) | | | | – |
//! | Close | socket | | | | | – |
//! | SetSockOpt / GetSockOpt | socket | level | name | | | option value |
//! | Select | – | nfds | timeout µs (`u64::MAX` = none) | | | 3 fd_sets of ⌈nfds/8⌉ bytes (bits = indices) |
//! | Poll | – | nfds | timeout ms (i32) | | | nfds × 8-byte pollfd (fd = index) |
//! | EpollCreate | – | | | | | – |
//! | EpollCtl | epoll | op (1 add, 2 del, 3 mod) | target socket index | events | | – |
//! | EpollWait | epoll | maxevents | timeout ms (i32) | | | maxevents × 12-byte epoll_event |
//!
//! Socket addresses travel by value in the parameters rather than as a
//! `sockaddr` pointer, so the host reads them from its copy of the INR.
//! `ret` of Socket, Accept and EpollCreate is the new socket-array index.

/// Bytes of one INR.
pub const INR_SIZE: usize = 0x50;
/// Scalar parameters an INR carries.
pub const INR_PARAMS: usize = 4;

/// `state`: the slot is free (guest-owned, not submitted).
pub const INR_FREE: u32 = 0;
/// `state`: submitted, not yet taken by the host.
pub const INR_REQUESTED: u32 = 1;
/// `state`: the host copied it and is working on it.
pub const INR_IN_SERVICE: u32 = 2;
/// `state`: `ret` holds the result.
pub const INR_COMPLETED: u32 = 3;

/// Field offsets inside an INR.
pub mod off {
    /// `state` (u32).
    pub const STATE: u64 = 0x00;
    /// `want_irq` (u32).
    pub const WANT_IRQ: u64 = 0x04;
    /// `call` (u16).
    pub const CALL: u64 = 0x08;
    /// reserved (u16).
    pub const RESERVED: u64 = 0x0a;
    /// `fd` (u32).
    pub const FD: u64 = 0x0c;
    /// `params` (4 × u64).
    pub const PARAMS: u64 = 0x10;
    /// `buf_gpa` (u64).
    pub const BUF_GPA: u64 = 0x30;
    /// `buf_len` (u64).
    pub const BUF_LEN: u64 = 0x38;
    /// `ret` (i64).
    pub const RET: u64 = 0x40;
    /// `cookie` (u64).
    pub const COOKIE: u64 = 0x48;
}

/// Bytes of one pollfd in a Poll buffer.
pub const POLLFD_SIZE: u64 = 8;
/// Bytes of one epoll_event in an EpollWait buffer (packed, as on x86-64).
pub const EPOLL_EVENT_SIZE: u64 = 12;

/// errno values written (negated) into `ret`; Linux x86-64 numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum Errno {
    Eintr = 4,
    Ebadf = 9,
    Eagain = 11,
    Efault = 14,
    Ebusy = 16,
    Einval = 22,
    Emfile = 24,
    Epipe = 32,
    Enosys = 38,
    Enotsock = 88,
    Eprotonosupport = 93,
    Eopnotsupp = 95,
    Eaddrinuse = 98,
    Eaddrnotavail = 99,
    Enetunreach = 101,
    Econnreset = 104,
    Enobufs = 105,
    Eisconn = 106,
    Enotconn = 107,
    Etimedout = 110,
    Econnrefused = 111,
}

impl Errno {
    /// Every variant, for tests and decoding.
    pub const ALL: [Errno; 21] = [
        Errno::Eintr,
        Errno::Ebadf,
        Errno::Eagain,
        Errno::Efault,
        Errno::Ebusy,
        Errno::Einval,
        Errno::Emfile,
        Errno::Epipe,
        Errno::Enosys,
        Errno::Enotsock,
        Errno::Eprotonosupport,
        Errno::Eopnotsupp,
        Errno::Eaddrinuse,
        Errno::Eaddrnotavail,
        Errno::Enetunreach,
        Errno::Econnreset,
        Errno::Enobufs,
        Errno::Eisconn,
        Errno::Enotconn,
        Errno::Etimedout,
        Errno::Econnrefused,
    ];

    /// The positive errno number.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The value `ret` holds for this error (`-errno`).
    pub fn ret(self) -> i64 {
        -(self.code() as i64)
    }

    /// The error a negative `ret` stands for, if it is one of ours.
    pub fn from_ret(ret: i64) -> Option<Errno> {
        Errno::ALL.into_iter().find(|e| e.ret() == ret)
    }
}

/// The function type of an INR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[allow(missing_docs)]
pub enum CallType {
    Socket = 1,
    Bind = 2,
    Listen = 3,
    Accept = 4,
    Connect = 5,
    Send = 6,
    Recv = 7,
    SendTo = 8,
    RecvFrom = 9,
    Shutdown = 10,
    Close = 11,
    SetSockOpt = 12,
    GetSockOpt = 13,
    Select = 14,
    Poll = 15,
    EpollCreate = 16,
    EpollCtl = 17,
    EpollWait = 18,
}

impl CallType {
    /// Every call type.
    pub const ALL: [CallType; 18] = [
        CallType::Socket,
        CallType::Bind,
        CallType::Listen,
        CallType::Accept,
        CallType::Connect,
        CallType::Send,
        CallType::Recv,
        CallType::SendTo,
        CallType::RecvFrom,
        CallType::Shutdown,
        CallType::Close,
        CallType::SetSockOpt,
        CallType::GetSockOpt,
        CallType::Select,
        CallType::Poll,
        CallType::EpollCreate,
        CallType::EpollCtl,
        CallType::EpollWait,
    ];

    /// The type an INR's `call` field names, if any.
    pub fn from_u16(v: u16) -> Option<CallType> {
        CallType::ALL.into_iter().find(|&c| c as u16 == v)
    }
}

/// One INR as plain fields (host or guest copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inr {
    /// `INR_FREE` .. `INR_COMPLETED`.
    pub state: u32,
    /// Nonzero: the waiter wants a completion interrupt.
    pub want_irq: u32,
    /// Raw call type (may name no [`CallType`]).
    pub call: u16,
    /// Reserved.
    pub reserved: u16,
    /// Socket-array index.
    pub fd: u32,
    /// Scalar parameters.
    pub params: [u64; INR_PARAMS],
    /// Buffer GPA.
    pub buf_gpa: u64,
    /// Buffer length.
    pub buf_len: u64,
    /// Return value.
    pub ret: i64,
    /// Guest's tag.
    pub cookie: u64,
}

/// `N` bytes of `b` from `at` (all offsets are constants inside INR_SIZE).
fn field<const N: usize>(b: &[u8; INR_SIZE], at: u64) -> [u8; N] {
    let at = at as usize;
    let mut out = [0; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

impl Inr {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; INR_SIZE] {
        let mut b = [0u8; INR_SIZE];
        let mut put = |at: u64, v: &[u8]| b[at as usize..at as usize + v.len()].copy_from_slice(v);
        put(off::STATE, &self.state.to_le_bytes());
        put(off::WANT_IRQ, &self.want_irq.to_le_bytes());
        put(off::CALL, &self.call.to_le_bytes());
        put(off::RESERVED, &self.reserved.to_le_bytes());
        put(off::FD, &self.fd.to_le_bytes());
        for (i, p) in self.params.iter().enumerate() {
            put(off::PARAMS + 8 * i as u64, &p.to_le_bytes());
        }
        put(off::BUF_GPA, &self.buf_gpa.to_le_bytes());
        put(off::BUF_LEN, &self.buf_len.to_le_bytes());
        put(off::RET, &self.ret.to_le_bytes());
        put(off::COOKIE, &self.cookie.to_le_bytes());
        b
    }

    /// The fields of a record; total (any bytes decode).
    pub fn decode(b: &[u8; INR_SIZE]) -> Inr {
        let mut params = [0u64; INR_PARAMS];
        for (i, p) in params.iter_mut().enumerate() {
            *p = u64::from_le_bytes(field(b, off::PARAMS + 8 * i as u64));
        }
        Inr {
            state: u32::from_le_bytes(field(b, off::STATE)),
            want_irq: u32::from_le_bytes(field(b, off::WANT_IRQ)),
            call: u16::from_le_bytes(field(b, off::CALL)),
            reserved: u16::from_le_bytes(field(b, off::RESERVED)),
            fd: u32::from_le_bytes(field(b, off::FD)),
            params,
            buf_gpa: u64::from_le_bytes(field(b, off::BUF_GPA)),
            buf_len: u64::from_le_bytes(field(b, off::BUF_LEN)),
            ret: i64::from_le_bytes(field(b, off::RET)),
            cookie: u64::from_le_bytes(field(b, off::COOKIE)),
        }
    }
}

/// A buffer: address (a GVA in the application's view, a GPA in an INR)
/// and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Buf {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// An IPv4 socket address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockAddr {
    /// IPv4 address, host byte order.
    pub ip: u32,
    /// Port.
    pub port: u16,
}

/// Socket type of `socket()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SockType {
    /// SOCK_STREAM (TCP).
    Stream = 1,
    /// SOCK_DGRAM (UDP).
    Dgram = 2,
}

/// A socket call with its arguments. `F` is how a socket is named: the
/// application's dummy fd (`i32`) before libCanal maps it, the socket-array
/// index (`u32`) inside an INR. Buffers carry GVAs before translation and
/// GPAs inside an INR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Call<F> {
    Socket {
        ty: SockType,
        protocol: u32,
    },
    Bind {
        fd: F,
        addr: SockAddr,
    },
    Listen {
        fd: F,
        backlog: u32,
    },
    Accept {
        fd: F,
    },
    Connect {
        fd: F,
        addr: SockAddr,
    },
    Send {
        fd: F,
        buf: Buf,
        flags: u32,
    },
    Recv {
        fd: F,
        buf: Buf,
        flags: u32,
    },
    SendTo {
        fd: F,
        buf: Buf,
        flags: u32,
        addr: SockAddr,
    },
    RecvFrom {
        fd: F,
        buf: Buf,
        flags: u32,
    },
    Shutdown {
        fd: F,
        how: u8,
    },
    Close {
        fd: F,
    },
    SetSockOpt {
        fd: F,
        level: u32,
        name: u32,
        val: Buf,
    },
    GetSockOpt {
        fd: F,
        level: u32,
        name: u32,
        val: Buf,
    },
    /// `timeout_us`: None waits forever.
    Select {
        nfds: u32,
        sets: Buf,
        timeout_us: Option<u64>,
    },
    Poll {
        nfds: u32,
        fds: Buf,
        timeout_ms: i32,
    },
    EpollCreate,
    EpollCtl {
        epfd: F,
        op: u8,
        fd: F,
        events: u32,
    },
    EpollWait {
        epfd: F,
        events: Buf,
        maxevents: u32,
        timeout_ms: i32,
    },
}

/// A call as an INR carries it.
pub type InrCall = Call<u32>;

/// `v` as a u32, or EINVAL.
fn u32_arg(v: u64) -> Result<u32, Errno> {
    u32::try_from(v).map_err(|_| Errno::Einval)
}

/// `v` (an i64 in two's complement) as an i32, or EINVAL.
fn i32_arg(v: u64) -> Result<i32, Errno> {
    i32::try_from(v as i64).map_err(|_| Errno::Einval)
}

/// `p[i], p[i+1]` as an IPv4 address and port, or EINVAL.
fn addr_arg(p: &[u64; INR_PARAMS], i: usize) -> Result<SockAddr, Errno> {
    Ok(SockAddr {
        ip: u32_arg(p[i])?,
        port: u16::try_from(p[i + 1]).map_err(|_| Errno::Einval)?,
    })
}

/// Fails with EINVAL unless `buf` holds `count` records of `size` bytes.
fn holds(buf: Buf, count: u64, size: u64) -> Result<(), Errno> {
    match count.checked_mul(size) {
        Some(need) if need <= buf.len => Ok(()),
        _ => Err(Errno::Einval),
    }
}

impl<F: Copy> Call<F> {
    /// Its function type.
    pub fn call_type(&self) -> CallType {
        use Call::*;
        match self {
            Socket { .. } => CallType::Socket,
            Bind { .. } => CallType::Bind,
            Listen { .. } => CallType::Listen,
            Accept { .. } => CallType::Accept,
            Connect { .. } => CallType::Connect,
            Send { .. } => CallType::Send,
            Recv { .. } => CallType::Recv,
            SendTo { .. } => CallType::SendTo,
            RecvFrom { .. } => CallType::RecvFrom,
            Shutdown { .. } => CallType::Shutdown,
            Close { .. } => CallType::Close,
            SetSockOpt { .. } => CallType::SetSockOpt,
            GetSockOpt { .. } => CallType::GetSockOpt,
            Select { .. } => CallType::Select,
            Poll { .. } => CallType::Poll,
            EpollCreate => CallType::EpollCreate,
            EpollCtl { .. } => CallType::EpollCtl,
            EpollWait { .. } => CallType::EpollWait,
        }
    }

    /// The socket (or epoll instance) it names in the `fd` field.
    pub fn fd(&self) -> Option<F> {
        use Call::*;
        match *self {
            Bind { fd, .. }
            | Listen { fd, .. }
            | Accept { fd }
            | Connect { fd, .. }
            | Send { fd, .. }
            | Recv { fd, .. }
            | SendTo { fd, .. }
            | RecvFrom { fd, .. }
            | Shutdown { fd, .. }
            | Close { fd }
            | SetSockOpt { fd, .. }
            | GetSockOpt { fd, .. } => Some(fd),
            EpollCtl { epfd, .. } | EpollWait { epfd, .. } => Some(epfd),
            Socket { .. } | Select { .. } | Poll { .. } | EpollCreate => None,
        }
    }

    /// The buffer it passes, if its type has one.
    pub fn buf(&self) -> Option<Buf> {
        use Call::*;
        match *self {
            Send { buf, .. } | Recv { buf, .. } | SendTo { buf, .. } | RecvFrom { buf, .. } => {
                Some(buf)
            }
            SetSockOpt { val, .. } | GetSockOpt { val, .. } => Some(val),
            Select { sets, .. } => Some(sets),
            Poll { fds, .. } => Some(fds),
            EpollWait { events, .. } => Some(events),
            _ => None,
        }
    }

    /// The same call with each socket name mapped by `f` and the buffer by
    /// `b` (libCanal: dummy fd → index, GVA → GPA).
    pub fn map<G: Copy, E>(
        self,
        mut f: impl FnMut(F) -> Result<G, E>,
        mut b: impl FnMut(Buf) -> Result<Buf, E>,
    ) -> Result<Call<G>, E> {
        use Call::*;
        Ok(match self {
            Socket { ty, protocol } => Socket { ty, protocol },
            Bind { fd, addr } => Bind { fd: f(fd)?, addr },
            Listen { fd, backlog } => Listen {
                fd: f(fd)?,
                backlog,
            },
            Accept { fd } => Accept { fd: f(fd)? },
            Connect { fd, addr } => Connect { fd: f(fd)?, addr },
            Send { fd, buf, flags } => Send {
                fd: f(fd)?,
                buf: b(buf)?,
                flags,
            },
            Recv { fd, buf, flags } => Recv {
                fd: f(fd)?,
                buf: b(buf)?,
                flags,
            },
            SendTo {
                fd,
                buf,
                flags,
                addr,
            } => SendTo {
                fd: f(fd)?,
                buf: b(buf)?,
                flags,
                addr,
            },
            RecvFrom { fd, buf, flags } => RecvFrom {
                fd: f(fd)?,
                buf: b(buf)?,
                flags,
            },
            Shutdown { fd, how } => Shutdown { fd: f(fd)?, how },
            Close { fd } => Close { fd: f(fd)? },
            SetSockOpt {
                fd,
                level,
                name,
                val,
            } => SetSockOpt {
                fd: f(fd)?,
                level,
                name,
                val: b(val)?,
            },
            GetSockOpt {
                fd,
                level,
                name,
                val,
            } => GetSockOpt {
                fd: f(fd)?,
                level,
                name,
                val: b(val)?,
            },
            Select {
                nfds,
                sets,
                timeout_us,
            } => Select {
                nfds,
                sets: b(sets)?,
                timeout_us,
            },
            Poll {
                nfds,
                fds,
                timeout_ms,
            } => Poll {
                nfds,
                fds: b(fds)?,
                timeout_ms,
            },
            EpollCreate => EpollCreate,
            EpollCtl {
                epfd,
                op,
                fd,
                events,
            } => EpollCtl {
                epfd: f(epfd)?,
                op,
                fd: f(fd)?,
                events,
            },
            EpollWait {
                epfd,
                events,
                maxevents,
                timeout_ms,
            } => EpollWait {
                epfd: f(epfd)?,
                events: b(events)?,
                maxevents,
                timeout_ms,
            },
        })
    }
}

impl InrCall {
    /// The INR that requests this call: `state` REQUESTED, polling mode,
    /// `ret` 0.
    pub fn to_inr(&self, cookie: u64) -> Inr {
        use Call::*;
        let a = |x: SockAddr| (x.ip as u64, x.port as u64);
        let params: [u64; INR_PARAMS] = match *self {
            Socket { ty, protocol } => [ty as u64, protocol as u64, 0, 0],
            Bind { addr, .. } | Connect { addr, .. } => [a(addr).0, a(addr).1, 0, 0],
            Listen { backlog, .. } => [backlog as u64, 0, 0, 0],
            Send { flags, .. } | Recv { flags, .. } | RecvFrom { flags, .. } => {
                [flags as u64, 0, 0, 0]
            }
            SendTo { flags, addr, .. } => [flags as u64, a(addr).0, a(addr).1, 0],
            Shutdown { how, .. } => [how as u64, 0, 0, 0],
            SetSockOpt { level, name, .. } | GetSockOpt { level, name, .. } => {
                [level as u64, name as u64, 0, 0]
            }
            Select {
                nfds, timeout_us, ..
            } => [nfds as u64, timeout_us.unwrap_or(u64::MAX), 0, 0],
            Poll {
                nfds, timeout_ms, ..
            } => [nfds as u64, timeout_ms as i64 as u64, 0, 0],
            EpollCtl { op, fd, events, .. } => [op as u64, fd as u64, events as u64, 0],
            EpollWait {
                maxevents,
                timeout_ms,
                ..
            } => [maxevents as u64, timeout_ms as i64 as u64, 0, 0],
            Accept { .. } | Close { .. } | EpollCreate => [0; INR_PARAMS],
        };
        let buf = self.buf().unwrap_or_default();
        Inr {
            state: INR_REQUESTED,
            want_irq: 0,
            call: self.call_type() as u16,
            reserved: 0,
            fd: self.fd().unwrap_or(0),
            params,
            buf_gpa: buf.addr,
            buf_len: buf.len,
            ret: 0,
            cookie,
        }
    }

    /// The call an INR requests, with the checks that need no host state:
    /// a known type (else ENOSYS), arguments in range (else EINVAL,
    /// EPROTONOSUPPORT for a protocol the host stack lacks), and buffers
    /// long enough for the record counts they claim, without overflow.
    /// Socket-array indices and buffer placement are the service's checks.
    pub fn from_inr(inr: &Inr) -> Result<InrCall, Errno> {
        use Call::*;
        let ty = CallType::from_u16(inr.call).ok_or(Errno::Enosys)?;
        let p = &inr.params;
        let fd = inr.fd;
        let buf = Buf {
            addr: inr.buf_gpa,
            len: inr.buf_len,
        };
        Ok(match ty {
            CallType::Socket => {
                let (ty, want) = match p[0] {
                    1 => (SockType::Stream, 6),
                    2 => (SockType::Dgram, 17),
                    _ => return Err(Errno::Einval),
                };
                let protocol = u32_arg(p[1])?;
                if protocol != 0 && protocol != want {
                    return Err(Errno::Eprotonosupport);
                }
                Socket { ty, protocol }
            }
            CallType::Bind => Bind {
                fd,
                addr: addr_arg(p, 0)?,
            },
            CallType::Listen => match p[0] {
                0..=0x7fff_ffff => Listen {
                    fd,
                    backlog: p[0] as u32,
                },
                _ => return Err(Errno::Einval),
            },
            CallType::Accept => Accept { fd },
            CallType::Connect => Connect {
                fd,
                addr: addr_arg(p, 0)?,
            },
            CallType::Send => Send {
                fd,
                buf,
                flags: u32_arg(p[0])?,
            },
            CallType::Recv => Recv {
                fd,
                buf,
                flags: u32_arg(p[0])?,
            },
            CallType::SendTo => SendTo {
                fd,
                buf,
                flags: u32_arg(p[0])?,
                addr: addr_arg(p, 1)?,
            },
            CallType::RecvFrom => RecvFrom {
                fd,
                buf,
                flags: u32_arg(p[0])?,
            },
            CallType::Shutdown => match p[0] {
                0..=2 => Shutdown {
                    fd,
                    how: p[0] as u8,
                },
                _ => return Err(Errno::Einval),
            },
            CallType::Close => Close { fd },
            CallType::SetSockOpt => SetSockOpt {
                fd,
                level: u32_arg(p[0])?,
                name: u32_arg(p[1])?,
                val: buf,
            },
            CallType::GetSockOpt => GetSockOpt {
                fd,
                level: u32_arg(p[0])?,
                name: u32_arg(p[1])?,
                val: buf,
            },
            CallType::Select => {
                let nfds = u32_arg(p[0])?;
                holds(buf, 3, (nfds as u64).div_ceil(8))?;
                Select {
                    nfds,
                    sets: buf,
                    timeout_us: (p[1] != u64::MAX).then_some(p[1]),
                }
            }
            CallType::Poll => {
                let nfds = u32_arg(p[0])?;
                holds(buf, nfds as u64, POLLFD_SIZE)?;
                Poll {
                    nfds,
                    fds: buf,
                    timeout_ms: i32_arg(p[1])?,
                }
            }
            CallType::EpollCreate => EpollCreate,
            CallType::EpollCtl => match p[0] {
                1..=3 => EpollCtl {
                    epfd: fd,
                    op: p[0] as u8,
                    fd: u32_arg(p[1])?,
                    events: u32_arg(p[2])?,
                },
                _ => return Err(Errno::Einval),
            },
            CallType::EpollWait => {
                let maxevents = u32_arg(p[0])?;
                if maxevents == 0 {
                    return Err(Errno::Einval);
                }
                holds(buf, maxevents as u64, EPOLL_EVENT_SIZE)?;
                EpollWait {
                    epfd: fd,
                    events: buf,
                    maxevents,
                    timeout_ms: i32_arg(p[1])?,
                }
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One call of every type, with distinctive arguments.
    pub(crate) fn one_of_each() -> Vec<InrCall> {
        let addr = SockAddr {
            ip: 0x0a00_0002,
            port: 80,
        };
        let buf = Buf {
            addr: 0x20_0000,
            len: 1448,
        };
        vec![
            Call::Socket {
                ty: SockType::Stream,
                protocol: 6,
            },
            Call::Bind { fd: 3, addr },
            Call::Listen {
                fd: 3,
                backlog: 128,
            },
            Call::Accept { fd: 3 },
            Call::Connect { fd: 4, addr },
            Call::Send {
                fd: 4,
                buf,
                flags: 0x40,
            },
            Call::Recv {
                fd: 4,
                buf,
                flags: 2,
            },
            Call::SendTo {
                fd: 5,
                buf,
                flags: 0,
                addr,
            },
            Call::RecvFrom {
                fd: 5,
                buf,
                flags: 0,
            },
            Call::Shutdown { fd: 4, how: 2 },
            Call::Close { fd: 4 },
            Call::SetSockOpt {
                fd: 4,
                level: 6,
                name: 1,
                val: Buf {
                    addr: 0x3000,
                    len: 4,
                },
            },
            Call::GetSockOpt {
                fd: 4,
                level: 1,
                name: 7,
                val: Buf {
                    addr: 0x3004,
                    len: 4,
                },
            },
            Call::Select {
                nfds: 17,
                sets: Buf {
                    addr: 0x4000,
                    len: 9,
                },
                timeout_us: Some(1500),
            },
            Call::Poll {
                nfds: 2,
                fds: Buf {
                    addr: 0x5000,
                    len: 16,
                },
                timeout_ms: -1,
            },
            Call::EpollCreate,
            Call::EpollCtl {
                epfd: 7,
                op: 1,
                fd: 4,
                events: 0x8000_0001,
            },
            Call::EpollWait {
                epfd: 7,
                events: Buf {
                    addr: 0x6000,
                    len: 120,
                },
                maxevents: 10,
                timeout_ms: 50,
            },
        ]
    }

    #[test]
    fn every_call_type_round_trips_through_the_bytes() {
        let calls = one_of_each();
        // One of each type, no type missing.
        let types: Vec<CallType> = calls.iter().map(|c| c.call_type()).collect();
        assert_eq!(types, CallType::ALL.to_vec());
        for (i, c) in calls.iter().enumerate() {
            let inr = c.to_inr(0xc0ffee + i as u64);
            let bytes = inr.encode();
            let back = Inr::decode(&bytes);
            assert_eq!(back, inr, "{c:?}");
            assert_eq!(back.state, INR_REQUESTED);
            assert_eq!(back.want_irq, 0);
            assert_eq!(InrCall::from_inr(&back), Ok(*c), "{c:?}");
        }
    }

    #[test]
    fn the_layout_is_the_documented_table() {
        let inr = Inr {
            state: 0x0302_0100,
            want_irq: 0x0706_0504,
            call: 0x0908,
            reserved: 0x0b0a,
            fd: 0x0f0e_0d0c,
            params: [
                0x1716_1514_1312_1110,
                0x1f1e_1d1c_1b1a_1918,
                0x2726_2524_2322_2120,
                0x2f2e_2d2c_2b2a_2928,
            ],
            buf_gpa: 0x3736_3534_3332_3130,
            buf_len: 0x3f3e_3d3c_3b3a_3938,
            ret: 0x4746_4544_4342_4140,
            cookie: 0x4f4e_4d4c_4b4a_4948,
        };
        let b = inr.encode();
        for (i, &x) in b.iter().enumerate() {
            assert_eq!(x as usize, i, "byte {i}");
        }
    }

    #[test]
    fn bad_arguments_get_the_right_errno() {
        let base = |call: CallType, params: [u64; 4], buf_len: u64| Inr {
            state: INR_REQUESTED,
            call: call as u16,
            params,
            buf_gpa: 0x1000,
            buf_len,
            ..Inr::default()
        };
        let e = |i: Inr| InrCall::from_inr(&i).unwrap_err();
        let unknown = Inr {
            call: 0,
            ..base(CallType::Close, [0; 4], 0)
        };
        assert_eq!(e(unknown), Errno::Enosys);
        assert_eq!(
            e(Inr {
                call: 19,
                ..unknown
            }),
            Errno::Enosys
        );
        assert_eq!(e(base(CallType::Socket, [3, 0, 0, 0], 0)), Errno::Einval);
        assert_eq!(
            e(base(CallType::Socket, [1, 17, 0, 0], 0)),
            Errno::Eprotonosupport
        );
        assert_eq!(e(base(CallType::Bind, [1, 65536, 0, 0], 0)), Errno::Einval);
        assert_eq!(
            e(base(CallType::Bind, [1 << 32, 80, 0, 0], 0)),
            Errno::Einval
        );
        assert_eq!(e(base(CallType::Shutdown, [3, 0, 0, 0], 0)), Errno::Einval);
        assert_eq!(e(base(CallType::EpollCtl, [0, 1, 0, 0], 0)), Errno::Einval);
        assert_eq!(
            e(base(CallType::Listen, [1 << 31, 0, 0, 0], 0)),
            Errno::Einval
        );
        // Counts whose byte size overflows or exceeds the buffer.
        assert_eq!(e(base(CallType::Poll, [3, 0, 0, 0], 16)), Errno::Einval);
        assert_eq!(
            e(base(CallType::EpollWait, [10, 0, 0, 0], 119)),
            Errno::Einval
        );
        assert_eq!(
            e(base(CallType::EpollWait, [0, 0, 0, 0], 120)),
            Errno::Einval
        );
        assert_eq!(e(base(CallType::Select, [17, 0, 0, 0], 8)), Errno::Einval);
        assert_eq!(
            e(base(CallType::Poll, [1, 1 << 40, 0, 0], 8)),
            Errno::Einval
        );
    }

    #[test]
    fn errno_ret_round_trips() {
        for e in Errno::ALL {
            assert!(e.ret() < 0);
            assert_eq!(Errno::from_ret(e.ret()), Some(e));
        }
        assert_eq!(Errno::from_ret(5), None);
    }

    proptest! {
        /// Any 80 bytes decode and re-encode to themselves; parsing them
        /// either fails with an errno or yields a call whose INR parses back
        /// to the same call.
        #[test]
        fn any_bytes_decode_and_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), INR_SIZE)) {
            let mut b = [0u8; INR_SIZE];
            b.copy_from_slice(&bytes);
            let inr = Inr::decode(&b);
            prop_assert_eq!(inr.encode(), b);
            if let Ok(c) = InrCall::from_inr(&inr) {
                prop_assert_eq!(InrCall::from_inr(&c.to_inr(inr.cookie)), Ok(c));
            }
        }
    }
}
