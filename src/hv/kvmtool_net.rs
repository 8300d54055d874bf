//! kvm-tools' userspace virtio-net back end (kvmtool as of Linux 3.5,
//! mid-2012: `virtio/net.c`, `virtio/pci.c`, `virtio/core.c`,
//! `ioeventfd.c`, `x86/kvm.c`; docs/calibration-sources.md §19). Without
//! `vhost=1` on its `-n` option (the default) kvmtool moves every frame
//! itself, with three threads of its process per device:
//!
//! * the **ioeventfd thread** (`ioeventfd__thread`): sleeps in
//!   `epoll_wait` on the eventfds KVM signals when the guest writes a
//!   queue's notify port; for each ready one it `read`s the eventfd and
//!   calls the queue's callback, which takes the queue's mutex and does
//!   `pthread_cond_signal` (a `FUTEX_WAKE`) to the queue's thread. A
//!   signal with no waiter is lost, harmlessly: the thread re-checks the
//!   ring under the mutex before it waits.
//! * the **TX thread** (`virtio_net_tx_thread`): under its mutex, waits on
//!   its condition variable while the ring is empty; then, for each
//!   available buffer, walks its descriptors and `writev`s the frame (with
//!   its virtio-net header: the tap has `IFF_VNET_HDR`) to the tap, one
//!   system call per frame, and returns it to the used ring. Once the ring
//!   is empty it signals the guest if `used_event` asks
//!   (`virtio_queue__should_signal`): one interrupt per drained batch.
//! * the **RX thread** (`virtio_net_rx_thread`): waits on its condition
//!   variable while the guest has posted no receive buffer; then, for
//!   each posted buffer, pops it and `readv`s one frame from the tap into
//!   it, **blocking in `readv`** while the tap is empty; after each frame
//!   it signals the guest if `used_event` asks.
//!
//! Every check of a ring (`virt_queue__available`) writes `avail_event` =
//! the next index the thread will take, so with EVENT_IDX the guest kicks
//! only after the thread found its ring empty ([`VirtioNetDev::tx_enable_notify`]
//! is that check). The guest's interrupt is raised from the thread with
//! two `ioctl(KVM_IRQ_LINE)` calls on the queue's MSI route (level 1 then
//! 0: `kvm__irq_trigger`); the first reaches `kvm_set_msi`, so the scheme
//! injects it as it would an irqfd's.
//!
//! Blocking system calls (`futex` in `pthread_cond_wait`, `epoll_wait`)
//! are charged on entry; one entered after its wake-up was already sent
//! returns at once (the futex word or the ready list changed), so no
//! wake-up is lost and none costs a sleep.

use crate::engine::Time;
use crate::hw::virtio_net::VirtioNetDev;
use crate::hw::wire::Frame;
use std::collections::VecDeque;

/// Costs of the back end (calibration section `kvmtool`).
#[derive(Clone, Copy, Debug, Default)]
pub struct KvmtoolCosts {
    /// A thread sleeping in a futex, `epoll_wait` or a tap `readv`, woken
    /// until it runs.
    pub wakeup: Time,
    /// Entry and exit of one system call whose work is charged apart.
    pub syscall: Time,
    /// The ioeventfd thread's work per ready eventfd besides its system
    /// calls: the ready-list walk, the 8-byte eventfd read, the callback's
    /// mutex and condition-variable bookkeeping.
    pub ioeventfd_event: Time,
    /// Per frame sent: the descriptor walk in user space and the kernel's
    /// `tun_get_user` (copy into an skb, `netif_rx_ni` into the bridge).
    pub tap_write: Time,
    /// Per frame received: `tun_do_read` (dequeue, copy into the guest
    /// buffer) and the used-ring update.
    pub tap_read: Time,
    /// Copy per KiB of a GSO packet beyond its first MTU-sized frame.
    pub copy_per_kib: Time,
    /// `KVM_IRQ_LINE` at level 1 past its system call: `kvm_set_irq` over
    /// the routing table to `kvm_set_msi` and the delivery to the vCPU.
    pub irq_line: Time,
}

/// The largest plain frame: the copy the per-frame costs include.
const MTU_FRAME: u32 = 1514;

impl KvmtoolCosts {
    fn gso_copy(&self, f: &Frame) -> Time {
        let beyond = u64::from(f.len().saturating_sub(MTU_FRAME));
        self.copy_per_kib * beyond / 1024
    }

    /// One `writev` of frame `f` to the tap.
    pub fn write(&self, f: &Frame) -> Time {
        self.syscall + self.tap_write + self.gso_copy(f)
    }

    /// One `readv` of frame `f` from the tap.
    pub fn read(&self, f: &Frame) -> Time {
        self.syscall + self.tap_read + self.gso_copy(f)
    }

    /// `kvm__irq_trigger`: two `KVM_IRQ_LINE` ioctls, the first injecting.
    pub fn signal(&self) -> Time {
        2 * self.syscall + self.irq_line
    }

    /// One ready eventfd: its `read`, the callback, the `FUTEX_WAKE`.
    pub fn event(&self) -> Time {
        2 * self.syscall + self.ioeventfd_event
    }
}

/// A thread of the back end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The process's ioeventfd thread (one per device here: the model's
    /// VMs have one virtio device each that uses it).
    Ioeventfd = 0,
    /// The TX queue's thread.
    Tx = 1,
    /// The RX queue's thread.
    Rx = 2,
}

/// Threads per device.
pub const THREADS: usize = 3;

impl Role {
    /// The role of thread `i % THREADS`.
    pub fn of(i: usize) -> Role {
        match i % THREADS {
            0 => Role::Ioeventfd,
            1 => Role::Tx,
            _ => Role::Rx,
        }
    }

    /// Its name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Role::Ioeventfd => "ioeventfd",
            Role::Tx => "tx",
            Role::Rx => "rx",
        }
    }
}

/// Virtqueue numbers (`VIRTIO_NET_RX_QUEUE`, `VIRTIO_NET_TX_QUEUE`).
const RXQ: usize = 0;
const TXQ: usize = 1;

/// A unit of work a thread has started and finishes after its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// The ioeventfd thread handles queue `q`'s eventfd.
    Event(usize),
    /// The ioeventfd thread enters `epoll_wait`.
    EpollWait,
    /// The TX thread `writev`s the frame of buffer `head`.
    Write { head: u16, f: Frame },
    /// The RX thread `readv`s frame `f` into buffer `head`.
    Read { head: u16, f: Frame },
    /// Two `KVM_IRQ_LINE` ioctls for queue `q`.
    Signal(usize),
    /// `pthread_cond_wait`'s futex entry.
    CondWait,
}

/// Where a thread sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Sleep {
    /// Awake: running a unit or about to.
    #[default]
    Awake,
    /// In `pthread_cond_wait`.
    Cond,
    /// In `epoll_wait`.
    Epoll,
    /// In a tap `readv`, holding guest buffer `.0`.
    TapRead(u16),
}

/// The TX thread's place in its loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxPhase {
    /// `while (virt_queue__available(vq))`: write frames.
    Drain,
    /// The ring is empty: signal if `used_event` asks.
    Signal,
    /// Under the mutex: the ring re-checked, then wait.
    Wait,
}

/// The RX thread's place in its loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxPhase {
    /// Under the mutex: wait while no buffer is posted.
    Wait,
    /// `while (virt_queue__available(vq))`: read frames into buffers.
    Drain,
}

/// One thread's state.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    inflight: Option<Unit>,
    /// Where it sleeps, if it does.
    pub sleep: Sleep,
    /// Its blocking call's entry is done and it sleeps next, unless a
    /// wake-up came meanwhile.
    entered: bool,
    /// A wake-up (condition signal, ready eventfd) came while it entered
    /// the blocking call: the call returns at once.
    signalled: bool,
    /// CPU time its units took.
    pub busy: Time,
    /// Times it was woken from a sleep.
    pub wakeups: u64,
}

/// What finishing a unit did, for the platform to carry out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// A frame written to the tap (now on the bridge).
    pub to_tap: Option<Frame>,
    /// Raise the interrupt of queue `.0` (0 = RX, 1 = TX).
    pub signal: Option<usize>,
    /// Wake this thread of the device (a condition signal to a waiter).
    pub wake: Option<Role>,
}

/// What a thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A unit of work that takes this long.
    Unit(Time),
    /// It sleeps until woken.
    Sleep,
}

/// Counters of one device.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct Counters {
    pub kicks: u64,
    pub events: u64,
    pub tx_frames: u64,
    pub rx_frames: u64,
    /// Interrupts raised, by queue (RX, TX).
    pub signals: [u64; 2],
    /// Drained batches (TX) or frames (RX) that `used_event` did not ask
    /// to be signalled.
    pub signals_suppressed: u64,
    /// Condition signals that found no waiter.
    pub lost_cond_signals: u64,
    pub tap_drops: u64,
    /// Times the RX thread blocked in `readv` on an empty tap.
    pub read_blocks: u64,
}

/// The back end of one virtio-net device: its tap and its three threads.
#[derive(Clone, Debug)]
pub struct KvmtoolNet {
    /// The VM it serves.
    pub vm: usize,
    /// The virtio-net device index on the machine.
    pub dev: usize,
    /// The eventfds of the RX and TX notify ports.
    pub kick_fd: [u16; 2],
    /// Frames the bridge has put on the tap for the guest.
    pub tap: VecDeque<Frame>,
    tap_capacity: usize,
    /// Eventfds signalled and not yet read, in the order they became
    /// ready (epoll's ready list).
    ready: VecDeque<usize>,
    /// The threads, by [`Role`].
    pub threads: [ThreadState; THREADS],
    tx_phase: TxPhase,
    rx_phase: RxPhase,
    /// The buffer the RX thread popped and is reading into.
    rx_held: Option<u16>,
    /// `used_event` asked to be signalled for the frame the RX thread just
    /// filled.
    rx_signal_next: bool,
    /// Counters.
    pub counters: Counters,
}

impl KvmtoolNet {
    /// The back end of device `dev` of `vm`; its threads start asleep, as
    /// kvmtool's are once the guest is booting (TX and RX in
    /// `pthread_cond_wait`, the ioeventfd thread in `epoll_wait`).
    pub fn new(vm: usize, dev: usize, kick_fd: [u16; 2], tap_capacity: usize) -> Self {
        let mut threads = [ThreadState::default(); THREADS];
        threads[Role::Ioeventfd as usize].sleep = Sleep::Epoll;
        threads[Role::Tx as usize].sleep = Sleep::Cond;
        threads[Role::Rx as usize].sleep = Sleep::Cond;
        KvmtoolNet {
            vm,
            dev,
            kick_fd,
            tap: VecDeque::with_capacity(tap_capacity),
            tap_capacity,
            ready: VecDeque::with_capacity(2),
            threads,
            tx_phase: TxPhase::Drain,
            rx_phase: RxPhase::Drain,
            rx_held: None,
            rx_signal_next: false,
            counters: Counters::default(),
        }
    }

    /// Whether thread `r` has a unit in flight.
    pub fn busy(&self, r: Role) -> bool {
        self.threads[r as usize].inflight.is_some()
    }

    /// KVM signalled eventfd `fd`. Returns `Some(true)` if it is one of
    /// this device's and the ioeventfd thread must be woken, `Some(false)`
    /// if it is this device's and the thread is awake, `None` otherwise.
    pub fn kick(&mut self, fd: u16) -> Option<bool> {
        let q = self.kick_fd.iter().position(|&k| k == fd)?;
        self.counters.kicks += 1;
        // An eventfd signalled twice before its read is one ready entry.
        if !self.ready.contains(&q) {
            self.ready.push_back(q);
        }
        Some(self.wake_from(Role::Ioeventfd, Sleep::Epoll))
    }

    /// A frame came out of the bridge onto the tap. Returns true if the RX
    /// thread, blocked in `readv`, must be woken; a full tap drops it.
    pub fn tap_receive(&mut self, f: Frame) -> bool {
        if self.tap.len() >= self.tap_capacity {
            self.counters.tap_drops += 1;
            return false;
        }
        self.tap.push_back(f);
        let rx = &mut self.threads[Role::Rx as usize];
        if let Sleep::TapRead(_) = rx.sleep {
            // Its readv goes on (with the buffer it holds) once it runs.
            rx.sleep = Sleep::Awake;
            rx.wakeups += 1;
            return true;
        }
        false
    }

    /// Thread `r` is woken if it sleeps in `how`; entering that sleep, the
    /// call returns at once. Returns whether it must be woken.
    fn wake_from(&mut self, r: Role, how: Sleep) -> bool {
        let t = &mut self.threads[r as usize];
        if t.sleep == how {
            t.sleep = Sleep::Awake;
            t.wakeups += 1;
            return true;
        }
        let entering = t.entered
            || match how {
                Sleep::Cond => t.inflight == Some(Unit::CondWait),
                Sleep::Epoll => t.inflight == Some(Unit::EpollWait),
                _ => false,
            };
        if entering {
            t.signalled = true;
        }
        false
    }

    /// `pthread_cond_signal` on queue `q`'s condition variable.
    fn cond_signal(&mut self, q: usize) -> Option<Role> {
        let r = if q == TXQ { Role::Tx } else { Role::Rx };
        let t = &self.threads[r as usize];
        let waiting = t.sleep == Sleep::Cond
            || t.inflight == Some(Unit::CondWait)
            || (t.entered && matches!(r, Role::Tx | Role::Rx));
        if !waiting {
            self.counters.lost_cond_signals += 1;
        }
        self.wake_from(r, Sleep::Cond).then_some(r)
    }

    /// Finishes thread `r`'s unit in flight (if any).
    pub fn finish(&mut self, r: Role, vq: &mut VirtioNetDev) -> Done {
        let Some(u) = self.threads[r as usize].inflight.take() else {
            return Done::default();
        };
        let mut done = Done::default();
        match u {
            Unit::Event(q) => {
                self.counters.events += 1;
                done.wake = self.cond_signal(q);
            }
            Unit::Write { head, f } => {
                vq.tx_complete(head);
                self.counters.tx_frames += 1;
                done.to_tap = Some(f);
            }
            Unit::Read { head, f } => {
                vq.rx_fill(head, f);
                self.counters.rx_frames += 1;
                // virtio_queue__should_signal right after each frame.
                self.rx_signal_next = vq.rx_need_signal();
                if !self.rx_signal_next {
                    self.counters.signals_suppressed += 1;
                }
            }
            Unit::Signal(q) => {
                self.counters.signals[q] += 1;
                done.signal = Some(q);
            }
            Unit::EpollWait | Unit::CondWait => self.threads[r as usize].entered = true,
        }
        done
    }

    /// Thread `r` picks its next unit, or sleeps.
    pub fn resume(&mut self, r: Role, vq: &mut VirtioNetDev, c: &KvmtoolCosts) -> Next {
        debug_assert!(self.threads[r as usize].inflight.is_none());
        let next = match r {
            Role::Ioeventfd => self.ioeventfd_next(),
            Role::Tx => self.tx_next(vq),
            Role::Rx => self.rx_next(vq),
        };
        let t = &mut self.threads[r as usize];
        t.inflight = next;
        match next {
            Some(u) => {
                let cost = match u {
                    Unit::Event(_) => c.event(),
                    Unit::EpollWait | Unit::CondWait => c.syscall,
                    Unit::Write { f, .. } => c.write(&f),
                    Unit::Read { f, .. } => c.read(&f),
                    Unit::Signal(_) => c.signal(),
                };
                t.busy += cost;
                Next::Unit(cost)
            }
            None => {
                debug_assert!(t.sleep != Sleep::Awake, "a thread that stops sleeps");
                Next::Sleep
            }
        }
    }

    /// Takes thread `r`'s blocking-call state: (it has just entered the
    /// call, a wake-up came meanwhile).
    fn take_entry(&mut self, r: Role) -> (bool, bool) {
        let t = &mut self.threads[r as usize];
        (
            std::mem::take(&mut t.entered),
            std::mem::take(&mut t.signalled),
        )
    }

    fn ioeventfd_next(&mut self) -> Option<Unit> {
        let (entered, _) = self.take_entry(Role::Ioeventfd);
        if let Some(q) = self.ready.pop_front() {
            return Some(Unit::Event(q));
        }
        if entered {
            self.threads[Role::Ioeventfd as usize].sleep = Sleep::Epoll;
            return None;
        }
        Some(Unit::EpollWait)
    }

    fn tx_next(&mut self, vq: &mut VirtioNetDev) -> Option<Unit> {
        loop {
            match self.tx_phase {
                TxPhase::Drain => {
                    // virt_queue__available: avail_event = last_avail_idx.
                    if vq.tx_enable_notify() {
                        let (head, f) = vq.tx_pop().expect("available checked");
                        return Some(Unit::Write { head, f });
                    }
                    self.tx_phase = TxPhase::Signal;
                }
                TxPhase::Signal => {
                    self.tx_phase = TxPhase::Wait;
                    if vq.tx_need_signal() {
                        return Some(Unit::Signal(TXQ));
                    }
                    self.counters.signals_suppressed += 1;
                }
                TxPhase::Wait => {
                    let (entered, signalled) = self.take_entry(Role::Tx);
                    if entered {
                        self.tx_phase = TxPhase::Drain;
                        if signalled {
                            continue;
                        }
                        self.threads[Role::Tx as usize].sleep = Sleep::Cond;
                        return None;
                    }
                    if vq.tx_enable_notify() {
                        self.tx_phase = TxPhase::Drain;
                        continue;
                    }
                    return Some(Unit::CondWait);
                }
            }
        }
    }

    fn rx_next(&mut self, vq: &mut VirtioNetDev) -> Option<Unit> {
        loop {
            match self.rx_phase {
                RxPhase::Wait => {
                    let (entered, signalled) = self.take_entry(Role::Rx);
                    if entered {
                        self.rx_phase = RxPhase::Drain;
                        if signalled {
                            continue;
                        }
                        self.threads[Role::Rx as usize].sleep = Sleep::Cond;
                        return None;
                    }
                    if vq.rx_enable_notify() {
                        self.rx_phase = RxPhase::Drain;
                        continue;
                    }
                    return Some(Unit::CondWait);
                }
                RxPhase::Drain => {
                    if std::mem::take(&mut self.rx_signal_next) {
                        return Some(Unit::Signal(RXQ));
                    }
                    let head = match self.rx_held.take() {
                        Some(h) => h,
                        None => {
                            if !vq.rx_enable_notify() {
                                self.rx_phase = RxPhase::Wait;
                                continue;
                            }
                            vq.rx_pop_buffer().expect("available checked")
                        }
                    };
                    if let Some(f) = self.tap.pop_front() {
                        return Some(Unit::Read { head, f });
                    }
                    // readv blocks on the empty tap, holding the buffer.
                    self.rx_held = Some(head);
                    self.counters.read_blocks += 1;
                    self.threads[Role::Rx as usize].sleep = Sleep::TapRead(head);
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> KvmtoolCosts {
        KvmtoolCosts {
            wakeup: 1,
            syscall: 2,
            ioeventfd_event: 3,
            tap_write: 10,
            tap_read: 20,
            copy_per_kib: 0,
            irq_line: 5,
        }
    }

    fn setup() -> (KvmtoolNet, VirtioNetDev) {
        let d = KvmtoolNet::new(0, 0, [7, 8], 4);
        let vq = VirtioNetDev::new(64, true, 0xC050).expect("queue size");
        (d, vq)
    }

    /// What a run of thread `r` until it sleeps did.
    #[derive(Default, Debug)]
    struct Run {
        sent: Vec<u64>,
        signals: Vec<usize>,
        wakes: Vec<Role>,
        time: Time,
    }

    fn run(d: &mut KvmtoolNet, vq: &mut VirtioNetDev, r: Role) -> Run {
        let mut out = Run::default();
        loop {
            let done = d.finish(r, vq);
            out.sent.extend(done.to_tap.map(|f| f.sent));
            out.signals.extend(done.signal);
            out.wakes.extend(done.wake);
            match d.resume(r, vq, &costs()) {
                Next::Unit(t) => out.time += t,
                Next::Sleep => return out,
            }
        }
    }

    /// The guest adds `n` frames and publishes them; whether it kicks.
    fn send(vq: &mut VirtioNetDev, n: u64, from: u64) -> bool {
        for i in 0..n {
            assert!(vq.tx_add(Frame::udp(1, 100, 0, from + i)));
        }
        vq.tx_kick_prepare()
    }

    /// A TX kick: the ioeventfd thread wakes, reads the eventfd and
    /// signals the TX thread's condition; the TX thread writes every frame
    /// in ring order, one writev each, signals once for the batch and goes
    /// back to its condition wait; the guest's next add kicks again.
    #[test]
    fn a_kick_goes_through_the_ioeventfd_thread_to_the_tx_thread() {
        let (mut d, mut vq) = setup();
        assert!(send(&mut vq, 5, 0), "the first publication kicks");
        assert_eq!(d.kick(8), Some(true), "epoll_wait returns: wake it");
        assert_eq!(d.kick(8), Some(false), "already awake, one ready entry");
        assert_eq!(d.kick(99), None, "not this device's eventfd");
        let io = run(&mut d, &mut vq, Role::Ioeventfd);
        assert_eq!(io.wakes, vec![Role::Tx], "the TX thread was waiting");
        assert_eq!(d.counters.events, 1);
        assert_eq!(d.threads[Role::Ioeventfd as usize].sleep, Sleep::Epoll);
        assert_eq!(d.threads[Role::Tx as usize].sleep, Sleep::Awake);
        let tx = run(&mut d, &mut vq, Role::Tx);
        assert_eq!(tx.sent, vec![0, 1, 2, 3, 4], "in ring order");
        assert_eq!(tx.signals, vec![TXQ], "one interrupt for the batch");
        // 5 writev (2 + 10), one signal (2 * 2 + 5), the futex entry (2).
        assert_eq!(tx.time, 5 * 12 + 9 + 2);
        assert_eq!(d.threads[Role::Tx as usize].sleep, Sleep::Cond);
        assert!(
            send(&mut vq, 1, 5),
            "the ring was found empty: kicks are on"
        );
    }

    /// While the TX thread drains, the guest's adds do not kick (each
    /// check moves avail_event to the next buffer only), and the thread
    /// takes them in the same run.
    #[test]
    fn adds_while_the_tx_thread_drains_do_not_kick() {
        let (mut d, mut vq) = setup();
        send(&mut vq, 2, 0);
        d.kick(8);
        run(&mut d, &mut vq, Role::Ioeventfd);
        assert!(d.finish(Role::Tx, &mut vq) == Done::default());
        assert!(matches!(
            d.resume(Role::Tx, &mut vq, &costs()),
            Next::Unit(_)
        ));
        assert!(!send(&mut vq, 3, 2), "the thread is behind: no kick");
        let tx = run(&mut d, &mut vq, Role::Tx);
        assert_eq!(tx.sent, vec![0, 1, 2, 3, 4]);
    }

    /// A condition signal sent while the TX thread enters its wait (its
    /// futex call under way) makes the wait return at once: no sleep, no
    /// lost frame.
    #[test]
    fn a_signal_during_the_wait_entry_is_not_lost() {
        let (mut d, mut vq) = setup();
        send(&mut vq, 1, 0);
        d.kick(8);
        run(&mut d, &mut vq, Role::Ioeventfd);
        // Drain the one frame and the signal; stop at the futex entry.
        loop {
            d.finish(Role::Tx, &mut vq);
            d.resume(Role::Tx, &mut vq, &costs());
            if d.threads[Role::Tx as usize].inflight == Some(Unit::CondWait) {
                break;
            }
        }
        assert!(send(&mut vq, 1, 1), "ring found empty: the add kicks");
        assert_eq!(d.kick(8), Some(true));
        let io = run(&mut d, &mut vq, Role::Ioeventfd);
        assert!(io.wakes.is_empty(), "the TX thread is not asleep yet");
        let tx = run(&mut d, &mut vq, Role::Tx);
        assert_eq!(tx.sent, vec![1], "the wait returned at once");
        assert_eq!(d.threads[Role::Tx as usize].wakeups, 1, "one real sleep");
    }

    /// The RX thread waits for guest buffers on its condition, then blocks
    /// in readv on the empty tap holding a buffer; each frame wakes it,
    /// fills the next buffer in order and is signalled.
    #[test]
    fn the_rx_thread_blocks_in_readv_and_fills_buffers_in_order() {
        let (mut d, mut vq) = setup();
        assert!(!d.tap_receive(Frame::udp(1, 100, 0, 10)), "no reader yet");
        for _ in 0..3 {
            assert!(vq.rx_add_buffer());
        }
        assert!(vq.rx_kick_prepare());
        assert_eq!(d.kick(7), Some(true));
        let io = run(&mut d, &mut vq, Role::Ioeventfd);
        assert_eq!(io.wakes, vec![Role::Rx]);
        let rx = run(&mut d, &mut vq, Role::Rx);
        assert_eq!(rx.signals, vec![RXQ], "the queued frame, signalled");
        assert!(matches!(
            d.threads[Role::Rx as usize].sleep,
            Sleep::TapRead(_)
        ));
        assert_eq!(d.counters.read_blocks, 1);
        assert!(d.tap_receive(Frame::udp(1, 100, 0, 11)), "wakes the reader");
        assert!(!d.tap_receive(Frame::udp(1, 100, 0, 12)), "already woken");
        run(&mut d, &mut vq, Role::Rx);
        let got: Vec<u64> = std::iter::from_fn(|| vq.rx_get()).map(|f| f.sent).collect();
        assert_eq!(got, vec![10, 11, 12], "every frame, in order");
        // Out of buffers: the thread waits on its condition again.
        assert_eq!(d.threads[Role::Rx as usize].sleep, Sleep::Cond);
        assert_eq!(d.counters.rx_frames, 3);
    }

    /// A full tap drops; a signal with no waiter is counted as lost.
    #[test]
    fn a_full_tap_drops_and_a_running_thread_loses_the_signal() {
        let (mut d, mut vq) = setup();
        for i in 0..5 {
            d.tap_receive(Frame::udp(1, 100, 0, i));
        }
        assert_eq!(d.counters.tap_drops, 1, "capacity 4");
        d.threads[Role::Tx as usize].sleep = Sleep::Awake;
        assert_eq!(d.cond_signal(TXQ), None);
        assert_eq!(d.counters.lost_cond_signals, 1);
        let _ = &mut vq;
    }
}
