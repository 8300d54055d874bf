//! libCanal against the real service.

use super::*;
use crate::hv::vcanal::service::{Dispatch, Outcome, Service, ServiceParams};
use proptest::prelude::*;

/// Guest RAM: 1 GiB; the channel at 64 KiB.
const RAM: u64 = 1 << 30;

/// The guest page tables: user pages at 0x7f00_0000_0000 map to GPA
/// 16 MiB + offset, except page 0x7f00_0000_3000 which maps far away.
fn walk(gva_page: u64) -> Option<u64> {
    let off = gva_page.checked_sub(0x7f00_0000_0000)?;
    if off >= 1 << 24 {
        return None;
    }
    Some(if off == 0x3000 {
        0x3000_0000
    } else {
        0x100_0000 + off
    })
}

const GVA: u64 = 0x7f00_0000_0000;

struct Rig {
    mem: GuestMemory,
    lib: LibCanal,
    svc: Service,
}

fn rig(ring_capacity: u32, pool_len: u32, poll_budget: u32) -> Rig {
    let layout = ChannelLayout {
        base: 0x10000,
        ring_capacity,
        pool_len,
    };
    let mut mem = GuestMemory::new(RAM, layout.base, layout.size() as usize).unwrap();
    layout.init(&mut mem).unwrap();
    let mut svc = Service::new(1, ServiceParams::default());
    svc.announce(0, layout, &mem).unwrap();
    let params = LibCanalParams {
        poll_budget,
        ..LibCanalParams::default()
    };
    Rig {
        mem,
        lib: LibCanal::new(params, layout),
        svc,
    }
}

impl Rig {
    fn submit(&mut self, call: Call<i32>) -> Submitted {
        self.lib.submit(&mut self.mem, call, walk).unwrap()
    }

    /// One service turn; the calls it issued.
    fn turn(&mut self) -> Vec<Dispatch> {
        let mut d = Vec::new();
        self.svc.turn(&mut self.mem, 64, |x| d.push(x)).unwrap();
        d
    }

    fn complete(&mut self, d: &Dispatch, o: Outcome, peer: Option<SockAddr>) -> bool {
        self.svc.complete(d, o, peer, &mut self.mem).unwrap()
    }

    /// Spins until done (within 100 steps).
    fn wait(&mut self, p: &mut Pending) -> Completion {
        for _ in 0..100 {
            if let WaitStep::Done(c) = self.lib.wait(&mut self.mem, p).unwrap() {
                return c;
            }
        }
        panic!("not done");
    }

    /// A call through the service, the host answering `o`.
    fn call(&mut self, call: Call<i32>, o: impl Fn(&Dispatch) -> Outcome) -> Completion {
        let mut s = self.submit(call);
        for d in self.turn() {
            self.complete(&d, o(&d), None);
        }
        self.wait(&mut s.pending)
    }

    fn socket(&mut self) -> i32 {
        let c = self.call(
            Call::Socket {
                ty: inr::SockType::Stream,
                protocol: 0,
            },
            |d| Outcome::NewSocket(500 + d.new_slot.unwrap().0),
        );
        c.ret.unwrap() as i32
    }
}

#[test]
fn socket_gives_a_dummy_fd_mapped_to_the_host_index() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let a = r.socket();
    let b = r.socket();
    assert_eq!((a, b), (3, 4));
    assert_eq!(r.lib.driver.index(a), Some(0));
    assert_eq!(r.lib.driver.index(b), Some(1));
    // A send on b reaches host socket 501 with a GPA buffer.
    let mut s = r.submit(Call::Send {
        fd: b,
        buf: Buf {
            addr: GVA + 0x10,
            len: 100,
        },
        flags: 0,
    });
    let d = r.turn();
    assert_eq!(d[0].socket, Some(501));
    assert_eq!(
        d[0].call.buf(),
        Some(Buf {
            addr: 0x100_0010,
            len: 100
        })
    );
    r.complete(&d[0], Outcome::Value(100), None);
    assert_eq!(r.wait(&mut s.pending).ret, Ok(100));
    // close() gives the dummy fd back; a call on it is EBADF at once.
    let c = r.call(Call::Close { fd: b }, |_| Outcome::Value(0));
    assert_eq!(c.ret, Ok(0));
    assert_eq!(r.lib.driver.index(b), None);
    let before = r.mem.clone();
    assert_eq!(
        r.lib
            .submit(&mut r.mem, Call::Listen { fd: b, backlog: 1 }, walk),
        Err(SubmitError::Errno(Errno::Ebadf))
    );
    assert_eq!(r.mem, before);
    assert_eq!(r.lib.free_inrs(), 16);
}

#[test]
fn a_failed_socket_call_releases_its_dummy_fd() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let c = r.call(Call::EpollCreate, |_| Outcome::Failed(Errno::Emfile));
    assert_eq!(c.ret, Err(Errno::Emfile));
    // The next one gets the same dummy fd.
    assert_eq!(r.socket(), 3);
}

#[test]
fn dummy_fds_run_out_with_emfile() {
    let mut d = HelperDriver::new(10, 2);
    assert_eq!(d.open(), Ok(10));
    assert_eq!(d.open(), Ok(11));
    assert_eq!(d.open(), Err(Errno::Emfile));
    d.map(11, 5);
    assert_eq!(d.index(11), Some(5));
    assert_eq!(d.index(10), None);
    assert_eq!(d.index(9), None);
    assert_eq!(d.index(i32::MIN), None);
    d.release(10);
    assert_eq!(d.open(), Ok(10));
}

#[test]
fn the_hybrid_address_space_misses_once_then_hits() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let fd = r.socket();
    // 8 KiB at an offset: three pages.
    let buf = Buf {
        addr: GVA + 0x4800,
        len: 0x2000,
    };
    let s1 = r.submit(Call::Send { fd, buf, flags: 0 });
    assert_eq!((s1.hits, s1.misses, s1.buf_len), (0, 3, 0x2000));
    let s2 = r.submit(Call::Send { fd, buf, flags: 0 });
    assert_eq!((s2.hits, s2.misses), (3, 0));
    // munmap of the middle page: one miss again.
    assert!(r.lib.cache.invalidate(GVA + 0x5000));
    let s3 = r.submit(Call::Recv { fd, buf, flags: 0 });
    assert_eq!((s3.hits, s3.misses), (2, 1));
}

#[test]
fn buffers_across_a_gpa_gap_shorten_data_calls_and_fail_structs() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let fd = r.socket();
    // GVA page +0x3000 is not GPA-contiguous with +0x2000.
    let buf = Buf {
        addr: GVA + 0x2f00,
        len: 0x200,
    };
    let s = r.submit(Call::Send { fd, buf, flags: 0 });
    assert_eq!(s.buf_len, 0x100);
    let e = r.lib.submit(
        &mut r.mem,
        Call::SetSockOpt {
            fd,
            level: 6,
            name: 1,
            val: buf,
        },
        walk,
    );
    assert_eq!(e, Err(SubmitError::Errno(Errno::Efault)));
    // An unmapped buffer fails in the guest.
    let e = r.lib.submit(
        &mut r.mem,
        Call::Recv {
            fd,
            buf: Buf {
                addr: 0x1000,
                len: 4,
            },
            flags: 0,
        },
        walk,
    );
    assert_eq!(e, Err(SubmitError::Errno(Errno::Efault)));
}

#[test]
fn a_full_ring_or_pool_refuses_and_gives_everything_back() {
    let mut r = rig(2, 3, DEFAULT_POLL_BUDGET);
    let fd = r.socket();
    let send = Call::Send {
        fd,
        buf: Buf::default(),
        flags: 0,
    };
    r.submit(send);
    r.submit(send);
    // Ring (2) full: the INR goes back to the pool.
    assert_eq!(
        r.lib.submit(&mut r.mem, send, walk),
        Err(SubmitError::RingFull)
    );
    assert_eq!(r.lib.free_inrs(), 1);
    // A socket() refused likewise gives its dummy fd back.
    let sock = Call::Socket {
        ty: inr::SockType::Dgram,
        protocol: 0,
    };
    assert_eq!(
        r.lib.submit(&mut r.mem, sock, walk),
        Err(SubmitError::RingFull)
    );
    assert_eq!(r.lib.driver.index(fd + 1), None);
    assert_eq!(r.lib.driver.open(), Ok(fd + 1));
    // The host takes both: the ring has room, but the pool has one INR.
    r.turn();
    r.submit(send);
    assert_eq!(
        r.lib.submit(&mut r.mem, send, walk),
        Err(SubmitError::NoInr)
    );
}

#[test]
fn polls_up_to_the_budget_then_asks_for_an_interrupt() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let fd = r.socket();
    let mut s = r.submit(Call::Recv {
        fd,
        buf: Buf::default(),
        flags: 0,
    });
    let d = r.turn();
    let steps: Vec<WaitStep> = (0..101)
        .map(|_| r.lib.wait(&mut r.mem, &mut s.pending).unwrap())
        .collect();
    assert!(steps[..99].iter().all(|x| *x == WaitStep::Spin));
    assert_eq!(steps[99], WaitStep::ArmInterrupt);
    // The re-check after arming: still not done, sleep.
    assert_eq!(steps[100], WaitStep::Sleep);
    assert_eq!(s.pending.polls(), 100);
    // Data arrives: the host must interrupt.
    assert!(r.complete(&d[0], Outcome::Value(42), None));
    assert_eq!(
        r.lib.wait(&mut r.mem, &mut s.pending).unwrap(),
        WaitStep::Done(Completion {
            ret: Ok(42),
            peer: None
        })
    );
    // A later request starts in polling mode again.
    let mut s = r.submit(Call::Recv {
        fd,
        buf: Buf::default(),
        flags: 0,
    });
    let d = r.turn();
    assert_eq!(r.lib.wait(&mut r.mem, &mut s.pending), Ok(WaitStep::Spin));
    assert!(!r.complete(&d[0], Outcome::Value(1), None));
    assert!(matches!(
        r.lib.wait(&mut r.mem, &mut s.pending),
        Ok(WaitStep::Done(_))
    ));
}

#[test]
fn interrupt_only_and_polling_only_variants() {
    // Budget 0: one check, then arm.
    let mut r = rig(16, 16, 0);
    let fd = r.socket();
    let mut s = r.submit(Call::Recv {
        fd,
        buf: Buf::default(),
        flags: 0,
    });
    assert_eq!(
        r.lib.wait(&mut r.mem, &mut s.pending),
        Ok(WaitStep::ArmInterrupt)
    );
    // Budget u32::MAX: never arms.
    let mut r = rig(16, 16, u32::MAX);
    let fd = r.socket();
    let mut s = r.submit(Call::Recv {
        fd,
        buf: Buf::default(),
        flags: 0,
    });
    for _ in 0..10_000 {
        assert_eq!(r.lib.wait(&mut r.mem, &mut s.pending), Ok(WaitStep::Spin));
    }
}

#[test]
fn accept_maps_a_new_dummy_fd_and_reports_the_peer() {
    let mut r = rig(16, 16, DEFAULT_POLL_BUDGET);
    let l = r.socket();
    let mut s = r.submit(Call::Accept { fd: l });
    let d = r.turn();
    let peer = SockAddr {
        ip: 0xc0a8_0102,
        port: 40000,
    };
    r.complete(&d[0], Outcome::NewSocket(777), Some(peer));
    let c = r.wait(&mut s.pending);
    let fd = c.ret.unwrap() as i32;
    assert_eq!(c.peer, Some(peer));
    assert_eq!(fd, l + 1);
    let index = r.lib.driver.index(fd).unwrap();
    assert_eq!(r.svc.socket_of(0, index), Some(777));
}

proptest! {
    /// The spin-then-sleep hand-off never loses a wake-up: whenever the
    /// host completes relative to the waiter's steps, a waiter that goes
    /// to sleep is interrupted (the host saw `want_irq`), and a waiter
    /// that saw the result never needed one.
    #[test]
    fn no_lost_wakeup(budget in 0u32..6, complete_at in 0usize..12) {
        let mut r = rig(16, 16, budget);
        let fd = r.socket();
        let mut s = r.submit(Call::Recv { fd, buf: Buf::default(), flags: 0 });
        let d = r.turn();
        let mut irq = None;
        for step in 0..16 {
            if step == complete_at {
                irq = Some(r.complete(&d[0], Outcome::Value(3), None));
            }
            match r.lib.wait(&mut r.mem, &mut s.pending).unwrap() {
                WaitStep::Done(c) => {
                    prop_assert_eq!(c.ret, Ok(3));
                    // Completed while polling: no interrupt was needed
                    // unless the waiter had armed.
                    if !s.pending.irq_mode() {
                        prop_assert_eq!(irq, Some(false));
                    }
                    return Ok(());
                }
                WaitStep::Sleep => {
                    // Asleep: it wakes only by the interrupt, so the
                    // completion (now or later) must ask for one.
                    let woke = match irq {
                        Some(i) => i,
                        None => r.complete(&d[0], Outcome::Value(3), None),
                    };
                    prop_assert!(woke, "asleep with no interrupt coming");
                    let c = r.lib.wait(&mut r.mem, &mut s.pending).unwrap();
                    prop_assert!(matches!(c, WaitStep::Done(_)));
                    return Ok(());
                }
                WaitStep::Spin | WaitStep::ArmInterrupt => {}
            }
        }
        prop_assert!(false, "neither done nor asleep");
    }
}
