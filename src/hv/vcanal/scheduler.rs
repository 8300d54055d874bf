//! The channel scheduler (vcanal.md §2.4): which VM's calls the polling
//! thread issues next. VMs take turns round robin; inside a turn a VM's
//! calls run by class, CMD before RX before TX, each class up to its
//! budget, and a VM that ran CMD calls yields once they are done.
//!
//! Calls wait in per-VM, per-class queues of fixed capacity (§7: one FIFO
//! per VM yet class priorities → drain it into per-class queues), allocated
//! once; a full queue refuses, it never grows.

use crate::guest::libcanal::inr::CallType;
use std::collections::VecDeque;

/// Scheduling class of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Control calls: no NIC access, short (§2.4: highest).
    Cmd = 0,
    /// Receive-side calls: the pool thread sleeps until data arrives.
    Rx = 1,
    /// Transmit-side calls: touch the NIC at once (§2.4: lowest).
    Tx = 2,
}

impl Class {
    /// The classes in service order.
    pub const ALL: [Class; 3] = [Class::Cmd, Class::Rx, Class::Tx];
}

/// The class of a call type. §2.4 places `socket`, `bind`, `listen`,
/// `shutdown` in CMD, `recv`/`recvfrom` in RX and `send`/`sendto` in TX;
/// for the calls it leaves out this is our assumption, by the same
/// criteria: `close`, the socket options and epoll set-up touch no NIC
/// (CMD); `accept` and the readiness waits (`select`, `poll`,
/// `epoll_wait`) sleep until the peer acts, like `recv` (RX); `connect`
/// sends a SYN at once, like `send` (TX).
pub fn class_of(t: CallType) -> Class {
    use CallType::*;
    match t {
        Socket | Bind | Listen | Shutdown | Close | SetSockOpt | GetSockOpt | EpollCreate
        | EpollCtl => Class::Cmd,
        Recv | RecvFrom | Accept | Select | Poll | EpollWait => Class::Rx,
        Send | SendTo | Connect => Class::Tx,
    }
}

/// Per-turn budgets of the channel scheduler.
///
/// **Assumption** (vcanal.md §7): the paper gives priorities and relative
/// slice lengths (RX shorter than TX, a VM yields after its CMD calls) but
/// no numbers. We count slices in calls rather than time and take RX 16,
/// TX 64 (our guess, §7: TX longer for bulk senders, RX short because its
/// calls mostly sleep in pool threads) and CMD 16 (so a VM opening many
/// sockets at once cannot hold the service for an unbounded turn). These
/// are configuration, not costs; change them to explore the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedParams {
    /// CMD calls a VM may run in one turn before it yields.
    pub cmd_budget: u32,
    /// RX calls a VM may run in one turn.
    pub rx_budget: u32,
    /// TX calls a VM may run in one turn.
    pub tx_budget: u32,
}

impl Default for SchedParams {
    fn default() -> Self {
        Self {
            cmd_budget: 16,
            rx_budget: 16,
            tx_budget: 64,
        }
    }
}

impl SchedParams {
    /// The budget of `c` (a budget of 0 counts as 1, so no class starves).
    pub fn budget(&self, c: Class) -> u32 {
        match c {
            Class::Cmd => self.cmd_budget,
            Class::Rx => self.rx_budget,
            Class::Tx => self.tx_budget,
        }
        .max(1)
    }
}

/// A FIFO that never grows past the capacity it was made with.
#[derive(Clone, Debug)]
pub struct BoundedQueue<T> {
    q: VecDeque<T>,
    cap: usize,
}

impl<T> BoundedQueue<T> {
    /// An empty queue holding up to `cap` items, allocated now.
    pub fn new(cap: usize) -> Self {
        Self {
            q: VecDeque::with_capacity(cap),
            cap,
        }
    }

    /// Appends `x`, or gives it back when full.
    pub fn push(&mut self, x: T) -> Result<(), T> {
        if self.q.len() >= self.cap {
            return Err(x);
        }
        self.q.push_back(x);
        Ok(())
    }

    /// Takes the oldest item.
    pub fn pop(&mut self) -> Option<T> {
        self.q.pop_front()
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Whether a push would be refused.
    pub fn is_full(&self) -> bool {
        self.q.len() >= self.cap
    }

    /// Bytes of item storage allocated (to show it never grows).
    pub fn allocated(&self) -> usize {
        self.q.capacity() * std::mem::size_of::<T>()
    }
}

/// Progress of the current VM's turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// Calls served so far this turn, per class.
    pub served: [u32; 3],
}

/// The channel scheduler over items `T` (the service's validated calls).
#[derive(Clone, Debug)]
pub struct ChannelScheduler<T> {
    params: SchedParams,
    queues: Vec<[BoundedQueue<T>; 3]>,
    current: usize,
    turn: Turn,
}

impl<T> ChannelScheduler<T> {
    /// A scheduler for `vms` VMs whose class queues hold `queue_capacity`
    /// calls each.
    pub fn new(vms: usize, queue_capacity: usize, params: SchedParams) -> Self {
        Self {
            params,
            queues: (0..vms)
                .map(|_| Class::ALL.map(|_| BoundedQueue::new(queue_capacity)))
                .collect(),
            current: 0,
            turn: Turn::default(),
        }
    }

    /// The VM whose turn it is.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The current turn's progress.
    pub fn turn(&self) -> Turn {
        self.turn
    }

    /// Queues a call of `vm` in class `c`; gives it back when that queue
    /// is full.
    pub fn push(&mut self, vm: usize, c: Class, x: T) -> Result<(), T> {
        self.queues[vm][c as usize].push(x)
    }

    /// Whether `vm`'s class-`c` queue is full.
    pub fn is_full(&self, vm: usize, c: Class) -> bool {
        self.queues[vm][c as usize].is_full()
    }

    /// Calls waiting in `vm`'s class-`c` queue.
    pub fn len(&self, vm: usize, c: Class) -> usize {
        self.queues[vm][c as usize].len()
    }

    /// Whether no call waits anywhere.
    pub fn is_empty(&self) -> bool {
        self.queues.iter().flatten().all(|q| q.is_empty())
    }

    /// The current VM's next call in this turn: CMD while any wait and the
    /// CMD budget lasts; after CMD calls ran the VM yields (None); else RX
    /// within its budget, then TX within its budget. None ends the turn.
    pub fn next_in_turn(&mut self) -> Option<(Class, T)> {
        let vm = self.current;
        let cmd = Class::Cmd as usize;
        for c in Class::ALL {
            let i = c as usize;
            if c != Class::Cmd && self.turn.served[cmd] > 0 {
                // §2.4: after its CMD calls the VM yields.
                return None;
            }
            if self.turn.served[i] < self.params.budget(c) {
                if let Some(x) = self.queues[vm][i].pop() {
                    self.turn.served[i] += 1;
                    return Some((c, x));
                }
            }
        }
        None
    }

    /// Ends the current turn: the next VM round robin.
    pub fn end_turn(&mut self) {
        self.current = (self.current + 1) % self.queues.len().max(1);
        self.turn = Turn::default();
    }

    /// Bytes of queue storage allocated (constant over the scheduler's
    /// life).
    pub fn allocated(&self) -> usize {
        self.queues.iter().flatten().map(|q| q.allocated()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one turn, returning the (class, item) sequence.
    fn turn(s: &mut ChannelScheduler<u32>) -> Vec<(Class, u32)> {
        let mut out = Vec::new();
        while let Some(x) = s.next_in_turn() {
            out.push(x);
        }
        s.end_turn();
        out
    }

    #[test]
    fn every_call_type_has_the_papers_class() {
        use CallType::*;
        for t in [Socket, Bind, Listen, Shutdown] {
            assert_eq!(class_of(t), Class::Cmd);
        }
        for t in [Recv, RecvFrom] {
            assert_eq!(class_of(t), Class::Rx);
        }
        for t in [Send, SendTo] {
            assert_eq!(class_of(t), Class::Tx);
        }
    }

    #[test]
    fn rx_before_tx_within_budgets() {
        let p = SchedParams {
            cmd_budget: 4,
            rx_budget: 2,
            tx_budget: 3,
        };
        let mut s = ChannelScheduler::new(1, 16, p);
        for i in 0..5 {
            s.push(0, Class::Tx, 100 + i).unwrap();
        }
        for i in 0..3 {
            s.push(0, Class::Rx, 200 + i).unwrap();
        }
        // Queued TX first, RX later: RX still goes first, 2 of them, then
        // 3 TX.
        assert_eq!(
            turn(&mut s),
            vec![
                (Class::Rx, 200),
                (Class::Rx, 201),
                (Class::Tx, 100),
                (Class::Tx, 101),
                (Class::Tx, 102)
            ]
        );
        assert_eq!(
            turn(&mut s),
            vec![(Class::Rx, 202), (Class::Tx, 103), (Class::Tx, 104)]
        );
        assert!(turn(&mut s).is_empty());
    }

    #[test]
    fn cmd_first_then_the_vm_yields() {
        let p = SchedParams {
            cmd_budget: 2,
            rx_budget: 8,
            tx_budget: 8,
        };
        let mut s = ChannelScheduler::new(2, 16, p);
        s.push(0, Class::Tx, 1).unwrap();
        s.push(0, Class::Rx, 2).unwrap();
        for i in 0..3 {
            s.push(0, Class::Cmd, 10 + i).unwrap();
        }
        s.push(1, Class::Tx, 20).unwrap();
        // VM 0: CMD up to its budget, then it yields with RX/TX waiting.
        assert_eq!(turn(&mut s), vec![(Class::Cmd, 10), (Class::Cmd, 11)]);
        // VM 1's turn.
        assert_eq!(turn(&mut s), vec![(Class::Tx, 20)]);
        // VM 0 again: its last CMD call, and it yields again.
        assert_eq!(turn(&mut s), vec![(Class::Cmd, 12)]);
        assert!(turn(&mut s).is_empty());
        // No CMD left: RX then TX.
        assert_eq!(turn(&mut s), vec![(Class::Rx, 2), (Class::Tx, 1)]);
    }

    #[test]
    fn round_robin_across_vms() {
        let mut s = ChannelScheduler::new(3, 8, SchedParams::default());
        for vm in 0..3 {
            for k in 0..2 {
                s.push(vm, Class::Tx, (vm * 10 + k) as u32).unwrap();
            }
        }
        let mut order = Vec::new();
        for _ in 0..3 {
            assert_eq!(s.current(), order.len());
            order.push(turn(&mut s));
        }
        assert_eq!(
            order,
            vec![
                vec![(Class::Tx, 0), (Class::Tx, 1)],
                vec![(Class::Tx, 10), (Class::Tx, 11)],
                vec![(Class::Tx, 20), (Class::Tx, 21)]
            ]
        );
        assert_eq!(s.current(), 0);
        assert!(s.is_empty());
    }

    #[test]
    fn full_queues_refuse_and_never_grow() {
        let mut s = ChannelScheduler::new(2, 4, SchedParams::default());
        let bytes = s.allocated();
        for i in 0..4 {
            s.push(1, Class::Rx, i).unwrap();
        }
        assert!(s.is_full(1, Class::Rx));
        assert!(!s.is_full(1, Class::Tx));
        assert_eq!(s.push(1, Class::Rx, 99), Err(99));
        assert_eq!(s.len(1, Class::Rx), 4);
        assert_eq!(s.allocated(), bytes);
    }
}
