//! The service against well-behaved and hostile guests.

use super::*;
use crate::guest::libcanal::inr::{Buf, INR_FREE};
use crate::hv::vcanal::channel::{self, slot_entry};
use crate::hv::vcanal::scheduler::Class;
use proptest::prelude::*;

/// Guest RAM of every test VM: 1 GiB.
const RAM: u64 = 1 << 30;
/// Where every test VM's channel lies.
const BASE: u64 = 0x10000;
/// A buffer inside RAM.
const BUF: Buf = Buf {
    addr: 0x20_0000,
    len: 1448,
};

/// One guest: its memory and channel.
struct Vm {
    mem: GuestMemory,
    layout: ChannelLayout,
}

impl Vm {
    fn new(ring_capacity: u32, pool_len: u32) -> Self {
        let layout = ChannelLayout {
            base: BASE,
            ring_capacity,
            pool_len,
        };
        let mut mem = GuestMemory::new(RAM, BASE, layout.size() as usize).unwrap();
        layout.init(&mut mem).unwrap();
        Self { mem, layout }
    }

    fn gpa(&self, inr: u32) -> u64 {
        self.layout.inr_gpa(inr).unwrap()
    }

    /// Writes `inr` into pool slot `i` (no enqueue).
    fn write(&mut self, i: u32, inr: &Inr) {
        let gpa = self.gpa(i);
        self.mem.write(gpa, &inr.encode()).unwrap();
    }

    /// Enqueues INR index `i` as it is.
    fn enqueue(&mut self, i: u32) {
        channel::enqueue(&mut self.mem, &self.layout, i).unwrap();
    }

    /// libCanal's submission, by hand: fill INR `i` with `call`, enqueue.
    fn submit(&mut self, i: u32, call: InrCall) {
        self.write(i, &call.to_inr(i as u64));
        self.enqueue(i);
    }

    fn read(&self, i: u32) -> Inr {
        let mut b = [0u8; INR_SIZE];
        self.mem.read(self.gpa(i), &mut b).unwrap();
        Inr::decode(&b)
    }

    /// The answer in INR `i`, if completed.
    fn answer(&self, i: u32) -> Option<i64> {
        let inr = self.read(i);
        (inr.state == INR_COMPLETED).then_some(inr.ret)
    }
}

fn params() -> ServiceParams {
    let ports = TranslatorParams {
        first_port: 40000,
        ports: 256,
        max_probes: 256,
    };
    ServiceParams {
        sockets_per_vm: 8,
        limits: ChannelLimits {
            max_ring_capacity: 64,
            max_pool_len: 64,
        },
        ring_budget: 8,
        queue_capacity: 4,
        sched: SchedParams {
            cmd_budget: 4,
            rx_budget: 2,
            tx_budget: 4,
        },
        tcp_ports: ports,
        udp_ports: ports,
    }
}

/// A service over `n` VMs with 16-slot rings and 64-INR pools, announced.
fn setup(n: usize, p: ServiceParams) -> (Service, Vec<Vm>) {
    let mut s = Service::new(n, p);
    let vms: Vec<Vm> = (0..n).map(|_| Vm::new(16, 64)).collect();
    for (i, v) in vms.iter().enumerate() {
        s.announce(i, v.layout, &v.mem).unwrap();
    }
    (s, vms)
}

/// The host stack of the tests: socket() gives host socket 100·(vm+1) +
/// index, anything else succeeds with 0.
fn stub(d: &Dispatch) -> Outcome {
    match d.new_slot {
        Some((i, _)) => Outcome::NewSocket(100 * (d.vm as u32 + 1) + i),
        None => Outcome::Value(0),
    }
}

/// One turn (of whichever VM is next), every issued call completed at
/// once by `stub`. Returns the report and the calls issued.
fn turn(s: &mut Service, vms: &mut [Vm], idle: usize) -> (TurnReport, Vec<Dispatch>) {
    let vm = s.next_vm();
    let mut issued = Vec::new();
    let r = s.turn(&mut vms[vm].mem, idle, |d| issued.push(d)).unwrap();
    for d in &issued {
        s.complete(d, stub(d), None, &mut vms[vm].mem).unwrap();
    }
    (r, issued)
}

/// Turns until every VM had `rounds` turns.
fn rounds(s: &mut Service, vms: &mut [Vm], rounds: usize) -> Vec<Dispatch> {
    let mut all = Vec::new();
    for _ in 0..rounds * vms.len() {
        all.extend(turn(s, vms, 64).1);
    }
    all
}

/// Opens a stream socket in VM `vm` through INR `inr`; its index.
fn open(s: &mut Service, vms: &mut [Vm], vm: usize, inr: u32) -> u32 {
    vms[vm].submit(
        inr,
        Call::Socket {
            ty: SockType::Stream,
            protocol: 0,
        },
    );
    rounds(s, vms, 1);
    let ret = vms[vm].answer(inr).expect("socket() answered");
    assert!(ret >= 0, "socket() failed: {ret}");
    ret as u32
}

#[test]
fn a_socket_is_created_bound_and_closed() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    assert_eq!(fd, 0);
    assert_eq!(
        s.slot(0, 0),
        Some(Slot::Open {
            host: 100,
            kind: SlotKind::Stream,
            port: None
        })
    );
    let addr = SockAddr {
        ip: 0x0a00_0002,
        port: 80,
    };
    vms[0].submit(1, Call::Bind { fd, addr });
    let d = rounds(&mut s, &mut vms, 1);
    assert_eq!(d.len(), 1);
    let port = d[0].host_port.unwrap();
    assert_eq!(d[0].socket, Some(100));
    assert_eq!(vms[0].answer(1), Some(0));
    assert_eq!(
        s.guest_of(SockType::Stream, port),
        Some(GuestAddr { vm: 0, addr })
    );
    // A second bind of the same socket: EINVAL, nothing issued.
    vms[0].submit(2, Call::Bind { fd, addr });
    assert!(rounds(&mut s, &mut vms, 1).is_empty());
    assert_eq!(vms[0].answer(2), Some(Errno::Einval.ret()));
    // close() frees the index and the host port.
    vms[0].submit(3, Call::Close { fd });
    rounds(&mut s, &mut vms, 1);
    assert_eq!(vms[0].answer(3), Some(0));
    assert_eq!(s.slot(0, fd), Some(Slot::Free));
    assert_eq!(s.guest_of(SockType::Stream, port), None);
    let st = s.stats(0);
    assert_eq!(
        (st.taken, st.issued, st.completed, st.rejected),
        (4, 3, 3, 1)
    );
}

#[test]
fn two_vms_bind_the_same_guest_port_to_different_host_ports() {
    let (mut s, mut vms) = setup(2, params());
    let addr = SockAddr {
        ip: 0x0a00_0002,
        port: 80,
    };
    let mut ports = Vec::new();
    for vm in 0..2 {
        let fd = open(&mut s, &mut vms, vm, 0);
        vms[vm].submit(1, Call::Bind { fd, addr });
        let d = rounds(&mut s, &mut vms, 1);
        ports.push(d[0].host_port.unwrap());
        assert_eq!(vms[vm].answer(1), Some(0));
    }
    assert_ne!(ports[0], ports[1]);
    for (vm, &p) in ports.iter().enumerate() {
        // Replies to each host port map back to their own VM.
        assert_eq!(
            s.guest_of(SockType::Stream, p),
            Some(GuestAddr { vm, addr })
        );
    }
    // UDP ports are a separate space.
    assert_eq!(s.guest_of(SockType::Dgram, ports[0]), None);
}

#[test]
fn hostile_unknown_call_type_is_answered_enosys() {
    let (mut s, mut vms) = setup(1, params());
    let mut inr = Call::Close { fd: 0 }.to_inr(0);
    inr.call = 0x7777;
    vms[0].write(0, &inr);
    vms[0].enqueue(0);
    let (r, d) = turn(&mut s, &mut vms, 8);
    assert!(d.is_empty());
    assert_eq!((r.taken, r.rejected, r.queued), (1, 1, 0));
    assert_eq!(vms[0].answer(0), Some(Errno::Enosys.ret()));
}

#[test]
fn hostile_fd_index_outside_the_socket_array_is_ebadf() {
    let (mut s, mut vms) = setup(1, params());
    // 8 is one past the array; u32::MAX far past it.
    vms[0].submit(0, Call::Listen { fd: 8, backlog: 1 });
    vms[0].submit(
        1,
        Call::Send {
            fd: u32::MAX,
            buf: BUF,
            flags: 0,
        },
    );
    // EpollCtl's second index is checked too.
    vms[0].submit(
        2,
        Call::EpollCtl {
            epfd: 0,
            op: 1,
            fd: 9,
            events: 1,
        },
    );
    // In range but nothing open there: EBADF when issued.
    vms[0].submit(3, Call::Close { fd: 3 });
    assert!(rounds(&mut s, &mut vms, 1).is_empty());
    for i in 0..4 {
        assert_eq!(vms[0].answer(i), Some(Errno::Ebadf.ret()), "INR {i}");
    }
}

#[test]
fn hostile_buffer_outside_ram_or_overflowing_is_efault() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    let bufs = [
        // Starts inside, ends past RAM.
        Buf {
            addr: RAM - 100,
            len: 101,
        },
        // Starts past RAM.
        Buf { addr: RAM, len: 1 },
        // gpa + len wraps around 2^64 (to a small, "valid" end).
        Buf {
            addr: u64::MAX - 9,
            len: 0x20,
        },
        // A length no RAM has.
        Buf {
            addr: 0x1000,
            len: u64::MAX,
        },
    ];
    for (i, &buf) in bufs.iter().enumerate() {
        vms[0].submit(1 + i as u32, Call::Send { fd, buf, flags: 0 });
    }
    // Ending exactly at the end of RAM is fine; so is an empty buffer
    // anywhere.
    vms[0].submit(
        5,
        Call::Recv {
            fd,
            buf: Buf {
                addr: RAM - 100,
                len: 100,
            },
            flags: 0,
        },
    );
    vms[0].submit(
        6,
        Call::Send {
            fd,
            buf: Buf {
                addr: u64::MAX,
                len: 0,
            },
            flags: 0,
        },
    );
    let d = rounds(&mut s, &mut vms, 1);
    for i in 1..5 {
        assert_eq!(vms[0].answer(i), Some(Errno::Efault.ret()), "INR {i}");
    }
    assert_eq!(d.len(), 2);
    assert_eq!((vms[0].answer(5), vms[0].answer(6)), (Some(0), Some(0)));
}

#[test]
fn hostile_counts_too_big_for_the_array_or_buffer_are_einval() {
    let (mut s, mut vms) = setup(1, params());
    // poll() over more fds than the array has (Linux: > RLIMIT_NOFILE).
    vms[0].submit(
        0,
        Call::Poll {
            nfds: 9,
            fds: Buf {
                addr: 0x1000,
                len: 72,
            },
            timeout_ms: 0,
        },
    );
    // A pollfd array longer than its buffer.
    let mut inr = Call::Poll {
        nfds: 4,
        fds: Buf {
            addr: 0x1000,
            len: 32,
        },
        timeout_ms: 0,
    }
    .to_inr(1);
    inr.buf_len = 31;
    vms[0].write(1, &inr);
    vms[0].enqueue(1);
    rounds(&mut s, &mut vms, 1);
    assert_eq!(vms[0].answer(0), Some(Errno::Einval.ret()));
    assert_eq!(vms[0].answer(1), Some(Errno::Einval.ret()));
}

#[test]
fn hostile_ring_entries_are_refused_in_the_slot() {
    let (mut s, mut vms) = setup(1, params());
    // An index past the pool: no INR to answer.
    vms[0].enqueue(64);
    vms[0].enqueue(u32::MAX);
    // An INR that was never requested (FREE), and one enqueued twice.
    vms[0].enqueue(3);
    vms[0].submit(4, Call::Close { fd: 0 });
    vms[0].enqueue(4);
    let (r, _) = turn(&mut s, &mut vms, 8);
    assert_eq!((r.taken, r.refused), (5, 4));
    let status = |pos| slot_entry(&vms[0].mem, &vms[0].layout, pos).unwrap().1;
    assert_eq!(status(0), Errno::Einval.ret() as i32);
    assert_eq!(status(1), Errno::Einval.ret() as i32);
    assert_eq!(status(2), Errno::Ebusy.ret() as i32);
    assert_eq!(status(3), 0);
    assert_eq!(status(4), Errno::Ebusy.ret() as i32);
    // The FREE INR was not touched; the duplicate was answered once.
    assert_eq!(vms[0].read(3).state, INR_FREE);
    assert_eq!(vms[0].answer(4), Some(Errno::Ebadf.ret()));
    assert_eq!(s.ring_head(0), Some(5));
}

#[test]
fn hostile_flood_is_bounded_per_turn_and_never_grows_host_memory() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    let bytes = s.allocated();
    let mut next = 1u32;
    let mut refill = |vm: &mut Vm| {
        // The guest keeps the ring full, recycling INRs 1..64 (never one
        // still in flight: at most 16 in the ring, 4 queued).
        let mut n = 0;
        loop {
            let i = 1 + next % 63;
            vm.write(
                i,
                &Call::Send {
                    fd,
                    buf: BUF,
                    flags: 0,
                }
                .to_inr(i as u64),
            );
            match channel::enqueue(&mut vm.mem, &vm.layout, i) {
                Ok(()) => {
                    next += 1;
                    n += 1;
                }
                Err(channel::RingError::Full) => return n,
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(refill(&mut vms[0]), 16);
    // No idle pool thread: the TX queue (4) fills and the ring is left.
    let (r, d) = turn(&mut s, &mut vms, 0);
    assert!(d.is_empty());
    assert_eq!((r.taken, r.queued), (4, 4));
    assert!(r.blocked);
    // (1 for the socket() above.)
    assert_eq!(s.stats(0).queued, 1 + 4);
    for _ in 0..50 {
        refill(&mut vms[0]);
        let (r, d) = turn(&mut s, &mut vms, 64);
        let p = params();
        assert!(r.taken <= p.ring_budget);
        assert!(d.len() as u32 <= p.sched.tx_budget);
        assert_eq!(s.allocated(), bytes);
    }
    // It was served all along, at the TX budget per turn.
    assert_eq!(s.stats(0).issued, 1 + 50 * 4);
}

#[test]
fn hostile_rewrite_while_in_service_changes_nothing_the_host_does() {
    let (mut s, mut vms) = setup(2, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    // VM 1 has a socket at index 1 (and 0).
    open(&mut s, &mut vms, 1, 0);
    let fd_b = open(&mut s, &mut vms, 1, 1);
    assert_eq!(fd_b, 1);
    vms[0].submit(
        1,
        Call::Send {
            fd,
            buf: BUF,
            flags: 0,
        },
    );
    let original = vms[0].read(1);
    // Taken but not issued (no idle thread): the host holds its copy.
    let (r, _) = turn(&mut s, &mut vms, 0);
    assert_eq!(r.queued, 1);
    assert_eq!(vms[0].read(1).state, INR_IN_SERVICE);
    // The guest now rewrites every field: another call, another index
    // (VM 1's socket's), a buffer outside RAM, REQUESTED again.
    let evil = Inr {
        state: INR_REQUESTED,
        want_irq: 0,
        call: CallType::Close as u16,
        reserved: 0xffff,
        fd: fd_b,
        params: [u64::MAX; 4],
        buf_gpa: u64::MAX - 1,
        buf_len: u64::MAX,
        ret: 0,
        cookie: 0xbad,
    };
    vms[0].write(1, &evil);
    turn(&mut s, &mut vms, 0); // VM 1's turn
    let vm0 = s.next_vm();
    assert_eq!(vm0, 0);
    let mut issued = Vec::new();
    s.turn(&mut vms[0].mem, 8, |d| issued.push(d)).unwrap();
    // The call issued is the one the host copied.
    assert_eq!(issued.len(), 1);
    let d = issued[0];
    assert_eq!(d.call, InrCall::from_inr(&original).unwrap());
    assert_eq!(d.socket, Some(100 + fd));
    // Rewritten again between issue and completion: the answer lands in
    // state and ret only.
    vms[0].write(1, &Inr { ret: 7, ..evil });
    s.complete(&d, Outcome::Value(1448), None, &mut vms[0].mem)
        .unwrap();
    let after = vms[0].read(1);
    assert_eq!(after.state, INR_COMPLETED);
    assert_eq!(after.ret, 1448);
    assert_eq!(
        Inr {
            state: evil.state,
            ret: evil.ret,
            ..after
        },
        evil
    );
    // VM 1's socket is untouched.
    assert!(matches!(
        s.slot(1, fd_b),
        Some(Slot::Open { host: 201, .. })
    ));
}

#[test]
fn a_vm_cannot_reach_another_vms_sockets() {
    let (mut s, mut vms) = setup(2, params());
    // VM 0 has index 0; VM 1 has indices 0, 1 and 2.
    open(&mut s, &mut vms, 0, 0);
    for i in 0..3 {
        open(&mut s, &mut vms, 1, i);
    }
    // VM 0 names VM 1's indices 1 and 2, and its own 0.
    for (inr, fd) in [(1, 1), (2, 2), (3, 0)] {
        vms[0].submit(
            inr,
            Call::Send {
                fd,
                buf: BUF,
                flags: 0,
            },
        );
    }
    let d = rounds(&mut s, &mut vms, 1);
    assert_eq!(vms[0].answer(1), Some(Errno::Ebadf.ret()));
    assert_eq!(vms[0].answer(2), Some(Errno::Ebadf.ret()));
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].vm, d[0].socket), (0, Some(100)));
    // Every host socket any dispatch of VM 0 carried is VM 0's.
    let vm1_hosts = [200, 201, 202];
    assert!(d.iter().all(|x| !vm1_hosts.contains(&x.socket.unwrap())));
    // Closing index 0 in VM 0 leaves VM 1's index 0 open.
    vms[0].submit(4, Call::Close { fd: 0 });
    rounds(&mut s, &mut vms, 1);
    assert_eq!(s.slot(0, 0), Some(Slot::Free));
    assert!(matches!(s.slot(1, 0), Some(Slot::Open { host: 200, .. })));
}

#[test]
fn a_socket_freed_before_its_queued_call_runs_is_not_reached() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    // send() queued (TX), then close() (CMD) from another thread: CMD runs
    // first and frees the index; the send then finds no socket.
    vms[0].submit(
        1,
        Call::Send {
            fd,
            buf: BUF,
            flags: 0,
        },
    );
    vms[0].submit(2, Call::Close { fd });
    let (_, d) = turn(&mut s, &mut vms, 8);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].call.call_type(), CallType::Close);
    let (_, d) = turn(&mut s, &mut vms, 8);
    assert!(d.is_empty());
    assert_eq!(vms[0].answer(1), Some(Errno::Ebadf.ret()));
}

#[test]
fn the_service_issues_cmd_then_yields_and_round_robins() {
    let (mut s, mut vms) = setup(2, params());
    let fd0 = open(&mut s, &mut vms, 0, 0);
    let fd1 = open(&mut s, &mut vms, 1, 0);
    // VM 0: TX, RX, then CMD queued last; VM 1: TX.
    vms[0].submit(
        1,
        Call::Send {
            fd: fd0,
            buf: BUF,
            flags: 0,
        },
    );
    vms[0].submit(
        2,
        Call::Recv {
            fd: fd0,
            buf: BUF,
            flags: 0,
        },
    );
    vms[0].submit(
        3,
        Call::Listen {
            fd: fd0,
            backlog: 4,
        },
    );
    vms[1].submit(
        1,
        Call::Send {
            fd: fd1,
            buf: BUF,
            flags: 0,
        },
    );
    let order: Vec<Vec<(usize, CallType)>> = (0..3)
        .map(|_| {
            turn(&mut s, &mut vms, 8)
                .1
                .iter()
                .map(|d| (d.vm, d.call.call_type()))
                .collect()
        })
        .collect();
    assert_eq!(
        order,
        vec![
            vec![(0, CallType::Listen)],
            vec![(1, CallType::Send)],
            vec![(0, CallType::Recv), (0, CallType::Send)],
        ]
    );
    assert_eq!(class_of(CallType::Listen), Class::Cmd);
}

#[test]
fn completion_interrupt_only_when_the_waiter_asked() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    vms[0].submit(
        1,
        Call::Recv {
            fd,
            buf: BUF,
            flags: 0,
        },
    );
    vms[0].submit(
        2,
        Call::Recv {
            fd,
            buf: BUF,
            flags: 0,
        },
    );
    let mut d = Vec::new();
    s.turn(&mut vms[0].mem, 8, |x| d.push(x)).unwrap();
    // The second waiter ran out of polls and set want_irq.
    let g2 = vms[0].gpa(2);
    vms[0].mem.write_u32(g2 + off::WANT_IRQ, 1).unwrap();
    let peer = SockAddr { ip: 7, port: 9 };
    assert!(!s
        .complete(&d[0], Outcome::Value(10), Some(peer), &mut vms[0].mem)
        .unwrap());
    assert!(s
        .complete(
            &d[1],
            Outcome::Failed(Errno::Econnreset),
            None,
            &mut vms[0].mem
        )
        .unwrap());
    assert_eq!(vms[0].answer(1), Some(10));
    assert_eq!(vms[0].answer(2), Some(Errno::Econnreset.ret()));
    assert_eq!(s.stats(0).irqs, 1);
    // An error answered by the service itself asks too.
    let mut inr = Call::Close { fd: 7 }.to_inr(3);
    inr.want_irq = 1;
    vms[0].write(3, &inr);
    vms[0].enqueue(3);
    let (r, _) = turn(&mut s, &mut vms, 8);
    assert_eq!(r.irqs, 1);
}

#[test]
fn accept_and_recvfrom_report_the_peer() {
    let (mut s, mut vms) = setup(1, params());
    let fd = open(&mut s, &mut vms, 0, 0);
    vms[0].submit(1, Call::Accept { fd });
    let mut d = Vec::new();
    s.turn(&mut vms[0].mem, 8, |x| d.push(x)).unwrap();
    let (new, kind) = d[0].new_slot.unwrap();
    assert_eq!((new, kind), (1, SlotKind::Stream));
    assert_eq!(s.slot(0, 1), Some(Slot::Reserved));
    let peer = SockAddr {
        ip: 0xc0a8_0001,
        port: 5555,
    };
    s.complete(&d[0], Outcome::NewSocket(900), Some(peer), &mut vms[0].mem)
        .unwrap();
    let inr = vms[0].read(1);
    assert_eq!(inr.ret, 1);
    assert_eq!(inr.params[..2], [0xc0a8_0001, 5555]);
    assert_eq!(s.socket_of(0, 1), Some(900));
    // A failed accept gives the index back.
    vms[0].submit(2, Call::Accept { fd });
    let mut d = Vec::new();
    s.turn(&mut vms[0].mem, 8, |x| d.push(x)).unwrap();
    s.complete(&d[0], Outcome::Failed(Errno::Eagain), None, &mut vms[0].mem)
        .unwrap();
    assert_eq!(s.slot(0, 2), Some(Slot::Free));
    assert_eq!(vms[0].answer(2), Some(Errno::Eagain.ret()));
}

#[test]
fn a_full_socket_array_is_emfile_and_kinds_are_checked() {
    let (mut s, mut vms) = setup(1, params());
    for i in 0..8 {
        open(&mut s, &mut vms, 0, i);
    }
    vms[0].submit(8, Call::EpollCreate);
    rounds(&mut s, &mut vms, 1);
    assert_eq!(vms[0].answer(8), Some(Errno::Emfile.ret()));
    // Free one, make it an epoll instance; socket calls on it are
    // ENOTSOCK, epoll calls on a socket EINVAL.
    // (The index is free once close() completes, not when it is issued.)
    vms[0].submit(9, Call::Close { fd: 7 });
    rounds(&mut s, &mut vms, 1);
    vms[0].submit(10, Call::EpollCreate);
    rounds(&mut s, &mut vms, 1);
    assert_eq!(vms[0].answer(10), Some(7));
    vms[0].submit(
        11,
        Call::Send {
            fd: 7,
            buf: BUF,
            flags: 0,
        },
    );
    vms[0].submit(
        12,
        Call::EpollWait {
            epfd: 0,
            events: Buf {
                addr: 0x1000,
                len: 12,
            },
            maxevents: 1,
            timeout_ms: 0,
        },
    );
    vms[0].submit(
        13,
        Call::EpollCtl {
            epfd: 7,
            op: 1,
            fd: 3,
            events: 1,
        },
    );
    // CMD (the EpollCtl), yield, then RX and TX.
    let d = rounds(&mut s, &mut vms, 2);
    assert_eq!(vms[0].answer(11), Some(Errno::Enotsock.ret()));
    assert_eq!(vms[0].answer(12), Some(Errno::Einval.ret()));
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].socket, d[0].target), (Some(107), Some(103)));
}

#[test]
fn announcements_are_checked_once_per_vm() {
    let mut s = Service::new(2, params());
    let v = Vm::new(16, 16);
    let big = ChannelLayout {
        ring_capacity: 128,
        ..v.layout
    };
    assert!(matches!(
        s.announce(0, big, &v.mem),
        Err(ServiceError::Channel(ChannelError::BadCapacity(128)))
    ));
    assert_eq!(s.announce(2, v.layout, &v.mem), Err(ServiceError::NoVm(2)));
    s.announce(0, v.layout, &v.mem).unwrap();
    assert_eq!(
        s.announce(0, v.layout, &v.mem),
        Err(ServiceError::AlreadyAnnounced(0))
    );
    // VM 1 announced nothing: its turn is empty.
    let mut m1 = Vm::new(16, 16);
    channel::enqueue(&mut m1.mem, &m1.layout, 0).unwrap();
    let mut v0 = v;
    s.turn(&mut v0.mem, 8, |_| {}).unwrap();
    let r = s.turn(&mut m1.mem, 8, |_| {}).unwrap();
    assert!(r.idle());
    assert_eq!(s.ring_head(1), None);
    // A service of no VMs has no turn to give.
    let mut none = Service::new(0, params());
    assert_eq!(
        none.turn(&mut m1.mem, 8, |_| {}).unwrap_err(),
        ServiceError::NoVm(0)
    );
}

/// What a hostile guest does between turns.
#[derive(Clone, Debug)]
enum Op {
    /// Random bytes anywhere in the channel (tail, ring, pool).
    Scribble { vm: usize, at: u16, bytes: Vec<u8> },
    /// A plausible INR, possibly wrong in any field, enqueued properly.
    Submit {
        vm: usize,
        inr: u32,
        call: u16,
        fd: u32,
        params: [u64; 4],
        buf: (u64, u64),
        want_irq: bool,
    },
    /// A service turn with this many idle pool threads.
    Turn { idle: usize },
    /// A pool thread finishes the `k`-th outstanding call.
    Complete { k: usize, fail: bool },
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly plausible values, so that calls also get through and run.
    let small = prop_oneof![4 => 0u64..3, 1 => Just(80), 1 => Just(u64::MAX), 1 => any::<u64>()];
    let buf = prop_oneof![
        4 => Just((0x20_0000, 1448)),
        1 => Just((RAM - 8, 16)),
        1 => Just((u64::MAX - 3, 8)),
        1 => (any::<u64>(), any::<u64>()),
    ];
    prop_oneof![
        1 => (0..2usize, any::<u16>(), proptest::collection::vec(any::<u8>(), 1..24))
            .prop_map(|(vm, at, bytes)| Op::Scribble { vm, at, bytes }),
        3 => (
            0..2usize,
            0u32..18,
            prop_oneof![4 => 1u16..19, 1 => any::<u16>()],
            prop_oneof![4 => 0u32..5, 1 => any::<u32>()],
            [small.clone(), small.clone(), small.clone(), small],
            buf,
            any::<bool>()
        )
            .prop_map(|(vm, inr, call, fd, params, buf, want_irq)| Op::Submit {
                vm,
                inr,
                call,
                fd,
                params,
                buf,
                want_irq
            }),
        2 => (0usize..4).prop_map(|idle| Op::Turn { idle }),
        1 => (0usize..8, any::<bool>()).prop_map(|(k, fail)| Op::Complete { k, fail }),
    ]
}

/// Completes outstanding call `k` (if any) in its VM's memory.
fn finish(s: &mut Service, vms: &mut [Vm], out: &mut Vec<Dispatch>, k: usize, fail: bool) {
    if out.is_empty() {
        return;
    }
    let d = out.swap_remove(k % out.len());
    let o = if fail {
        Outcome::Failed(Errno::Econnreset)
    } else {
        stub(&d)
    };
    s.complete(&d, o, None, &mut vms[d.vm].mem).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    /// A hostile guest writes random bytes over its ring (indices, slots)
    /// and INR pool and enqueues INRs wrong in any field, between turns of
    /// the service with pool threads finishing calls in any order. The
    /// service never panics or errs, its host memory never changes size,
    /// each turn's work is within its budgets, and every ring entry it
    /// consumes is answered: refused in the slot, or an error in the INR,
    /// or issued and (once the pool finishes it) completed. With the guest
    /// quiet, the entries taken last are checked in guest memory too.
    #[test]
    fn random_guest_bytes_never_break_the_service(ops in proptest::collection::vec(op(), 1..120)) {
        let mut p = params();
        p.ring_budget = 6;
        p.queue_capacity = 3;
        p.sockets_per_vm = 4;
        let mut vms: Vec<Vm> = (0..2).map(|_| Vm::new(8, 16)).collect();
        let mut s = Service::new(2, p);
        for (i, v) in vms.iter().enumerate() {
            s.announce(i, v.layout, &v.mem).unwrap();
        }
        let bytes = s.allocated();
        let mut out: Vec<Dispatch> = Vec::new();
        for o in ops {
            match o {
                Op::Scribble { vm, at, bytes } => {
                    let v = &mut vms[vm];
                    let at = v.layout.base + at as u64 % v.layout.size();
                    let n = bytes.len().min((v.layout.base + v.layout.size() - at) as usize);
                    v.mem.write(at, &bytes[..n]).unwrap();
                }
                Op::Submit { vm, inr, call, fd, params, buf, want_irq } => {
                    let v = &mut vms[vm];
                    let i = Inr {
                        state: INR_REQUESTED,
                        want_irq: want_irq as u32,
                        call,
                        fd,
                        params,
                        buf_gpa: buf.0,
                        buf_len: buf.1,
                        ..Inr::default()
                    };
                    if let Some(gpa) = v.layout.inr_gpa(inr) {
                        v.mem.write(gpa, &i.encode()).unwrap();
                    }
                    let _ = channel::enqueue(&mut v.mem, &v.layout, inr);
                }
                Op::Turn { idle } => {
                    let vm = s.next_vm();
                    let before = out.len();
                    let r = s.turn(&mut vms[vm].mem, idle, |d| out.push(d)).unwrap();
                    prop_assert!(r.taken <= p.ring_budget);
                    prop_assert!(r.issued as usize <= idle);
                    prop_assert_eq!(out.len() - before, r.issued as usize);
                    prop_assert!(out[before..].iter().all(|d| d.vm == vm));
                }
                Op::Complete { k, fail } => finish(&mut s, &mut vms, &mut out, k, fail),
            }
            prop_assert_eq!(s.allocated(), bytes);
        }
        // The guest goes quiet: finish everything, then turn until no
        // queue holds a call and every ring is empty.
        while !out.is_empty() {
            finish(&mut s, &mut vms, &mut out, 0, false);
        }
        let heads: Vec<u64> = (0..2).map(|vm| s.ring_head(vm).unwrap()).collect();
        for _ in 0..64 {
            let vm = s.next_vm();
            s.turn(&mut vms[vm].mem, 8, |d| out.push(d)).unwrap();
            while !out.is_empty() {
                finish(&mut s, &mut vms, &mut out, 0, false);
            }
        }
        prop_assert!(s.queues_empty());
        for (vm, v) in vms.iter().enumerate() {
            let st = s.stats(vm);
            prop_assert_eq!(st.taken, st.refused + st.rejected + st.issued);
            prop_assert_eq!(st.issued, st.completed);
            // Entries taken while the guest was quiet, seen in its memory.
            for pos in heads[vm]..s.ring_head(vm).unwrap() {
                let (inr, status) = slot_entry(&v.mem, &v.layout, pos).unwrap();
                if status == 0 {
                    prop_assert_eq!(v.read(inr).state, INR_COMPLETED);
                } else {
                    prop_assert!(status == Errno::Einval.ret() as i32 || status == Errno::Ebusy.ret() as i32);
                }
            }
        }
        prop_assert_eq!(s.allocated(), bytes);
    }
}

/// The HTTP server's call types from a hostile guest: accept() and
/// epoll_wait() naming indices past the array, an epoll_wait() buffer
/// outside RAM, one too small for its maxevents, and epoll_wait() on a
/// socket or accept() on an epoll instance: each answered, nothing issued.
#[test]
fn hostile_accept_and_epoll_wait_are_answered() {
    let (mut s, mut vms) = setup(1, params());
    let sock = open(&mut s, &mut vms, 0, 0);
    vms[0].submit(1, Call::EpollCreate);
    rounds(&mut s, &mut vms, 1);
    let ep = vms[0].answer(1).expect("epoll_create answered");
    assert!(ep >= 0, "{ep}");
    let ep = ep as u32;
    let wait = |epfd, addr, len, maxevents| Call::EpollWait {
        epfd,
        events: Buf { addr, len },
        maxevents,
        timeout_ms: -1,
    };
    vms[0].submit(2, Call::Accept { fd: 8 });
    vms[0].submit(3, wait(u32::MAX, 0x1000, 96, 8));
    vms[0].submit(4, wait(ep, RAM - 12, 96, 8));
    vms[0].submit(5, wait(ep, 0x1000, 95, 8));
    vms[0].submit(6, wait(sock, 0x1000, 96, 8));
    vms[0].submit(7, Call::Accept { fd: ep });
    let d = rounds(&mut s, &mut vms, 2);
    assert!(d.is_empty(), "{d:?}");
    let want = [
        (2, Errno::Ebadf),
        (3, Errno::Ebadf),
        (4, Errno::Efault),
        (5, Errno::Einval),
        (6, Errno::Einval),
        (7, Errno::Enotsock),
    ];
    for (i, e) in want {
        assert_eq!(vms[0].answer(i), Some(e.ret()), "INR {i}");
    }
}
