//! The pending-event set: a binary min-heap keyed by (time, sequence number).
//!
//! The sequence number is assigned at insertion, so events due at the same
//! picosecond pop in the order they were scheduled: the tie-break is a pure
//! function of the run's history, which is what makes runs byte-identical.
//! Cancellation is by generation counters held by the event's owner (a stale
//! event is popped and ignored), so the heap never needs a search.
//!
//! Most events are due soon (a core's work segment ends before anything
//! else is due, a frame lands a few microseconds out), and a run of one VM
//! has only a handful pending, so the queue keeps the earliest of the
//! events scheduled lately, up to [`NEAR`] of them, in a small sorted array
//! beside the heap: the *near* set. A new event goes into the near set if
//! it has room; when it is full, an event due before the set's latest
//! entry takes that entry's place (the latest moves to the heap), any
//! other goes into the heap. A pop compares the near set's first entry
//! with the heap's and takes the earlier. Each of the two is in (time,
//! key) order, so the pops are exactly a single heap's. A pop from the
//! near set is a load and an insertion moves the few entries due before
//! the new one, where a heap moves entries along a path of its tree on
//! every push and every pop.
//!
//! An event that would pop next as soon as it is scheduled (due before
//! everything pending) can skip the queue altogether: its owner asks
//! [`EventQueue::would_pop_next`] and, if so, [`EventQueue::pass_through`]
//! moves the clock, uses the key and counts the pop as scheduling and
//! popping it would, and the owner handles the event at once. A guest's
//! work segment that ends before anything else is due does this (the
//! world's `guest_run_from_segment`).
//!
//! For race exploration a queue can be *perturbed* ([`EventQueue::perturb`]):
//! ties at one picosecond then break in a seeded random order, and events
//! scheduled with [`EventQueue::schedule_async`] (messages in flight whose
//! latency real hardware does not fix: an MSI, an IPI, a frame, a host
//! decision) arrive up to a bounded jitter late. A perturbed run is still a
//! pure function of (scenario, seed, perturbation seed).

use super::rng::RngStream;
use super::time::Time;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Entry<E> {
    at: Time,
    seq: u64,
    event: E,
}

impl<E> Entry<E> {
    /// Whether `self` pops before `other`: earlier, then lower key.
    #[inline]
    fn before(&self, other: &Self) -> bool {
        (self.at, self.seq) < (other.at, other.seq)
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // BinaryHeap is a max-heap: invert so the earliest (then first-scheduled) is on top.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// How many events the near set holds. A one-VM run has 5-8 pending
/// events, so they all fit; in deeper queues the set keeps the earliest of
/// those scheduled lately (docs/performance.md, issue 25 item 5).
pub const NEAR: usize = 8;

/// Event queue with simulated clock. `E` is a small `Copy` payload.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    /// Pending events outside `heap`, latest first (the next to pop from
    /// here is the last), at most [`NEAR`].
    near: Near<E>,
    now: Time,
    seq: u64,
    popped: u64,
    perturbation: Option<Perturbation>,
}

/// How a perturbed queue departs from the deterministic order.
struct Perturbation {
    rng: RngStream,
    max_jitter: Time,
    shuffle_ties: bool,
}

/// The near set's storage: a fixed array and its length, so an insertion
/// has no capacity to check and nothing to grow.
struct Near<E> {
    items: [Entry<E>; NEAR],
    len: usize,
}

impl<E: Copy> Near<E> {
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn last(&self) -> Option<&Entry<E>> {
        self.len.checked_sub(1).map(|i| &self.items[i])
    }

    #[inline]
    fn pop(&mut self) -> Option<Entry<E>> {
        let i = self.len.checked_sub(1)?;
        self.len = i;
        Some(self.items[i])
    }

    fn iter(&self) -> impl Iterator<Item = &Entry<E>> {
        self.items[..self.len].iter()
    }
}

impl<E: Copy + Default> EventQueue<E> {
    /// An empty queue at time 0 with room for `capacity` pending events
    /// before it has to grow (growth is the only allocation it ever does).
    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(capacity),
            near: Near {
                items: [Entry {
                    at: 0,
                    seq: 0,
                    event: E::default(),
                }; NEAR],
                len: 0,
            },
            now: 0,
            seq: 0,
            popped: 0,
            perturbation: None,
        }
    }

    /// Perturbs the order from now on: with `shuffle_ties`, events due at
    /// the same picosecond pop in an order drawn from `seed`; events
    /// scheduled with [`Self::schedule_async`] arrive up to `max_jitter`
    /// late (uniform).
    pub fn perturb(&mut self, seed: u64, max_jitter: Time, shuffle_ties: bool) {
        self.perturbation = Some(Perturbation {
            rng: RngStream::new(seed, "engine.perturbation"),
            max_jitter,
            shuffle_ties,
        });
    }

    /// Current simulated time: the time of the last popped event.
    #[inline]
    pub fn now(&self) -> Time {
        self.now
    }

    /// Schedules `event` at absolute time `at`. Times in the past are clamped
    /// to now: causality is never violated, the event just runs next.
    #[inline]
    pub fn schedule(&mut self, at: Time, event: E) {
        let seq = self.reserve();
        self.schedule_reserved(at, seq, event);
    }

    /// Takes the tie-break key that [`Self::schedule`] would give an event
    /// scheduled now, without scheduling one. An owner that knows it will
    /// need an event at some time, but not yet whether it must be queued,
    /// reserves its place among the events due at that picosecond and
    /// queues it later with [`Self::schedule_reserved`]: the order is the
    /// same as if it had been scheduled now.
    #[inline]
    pub fn reserve(&mut self) -> u64 {
        self.seq += 1;
        match &mut self.perturbation {
            Some(p) if p.shuffle_ties => p.rng.next_u64(),
            _ => self.seq,
        }
    }

    /// Schedules `event` at `at` (clamped to now) in the place among ties
    /// that `key`, from [`Self::reserve`], holds.
    #[inline]
    pub fn schedule_reserved(&mut self, at: Time, key: u64, event: E) {
        let e = Entry {
            at: at.max(self.now),
            seq: key,
            event,
        };
        let n = self.near.len;
        if n < NEAR {
            // Insertion into the sorted set, scanning from the earliest
            // end (new events are mostly due soon).
            let near = &mut self.near.items;
            self.near.len = n + 1;
            let mut i = n;
            while i > 0 && near[i - 1].before(&e) {
                near[i] = near[i - 1];
                i -= 1;
            }
            near[i] = e;
        } else {
            self.schedule_full(e);
        }
    }

    /// [`Self::schedule_reserved`] with the near set full. Out of line, so
    /// that the common insertion above needs no registers saved for the
    /// heap's push.
    #[inline(never)]
    fn schedule_full(&mut self, e: Entry<E>) {
        let near = &mut self.near.items;
        if e.before(&near[0]) {
            // Full: the latest near entry makes room by moving to the heap.
            self.heap.push(near[0]);
            let mut i = 1;
            while i < NEAR && !near[i].before(&e) {
                near[i - 1] = near[i];
                i += 1;
            }
            near[i - 1] = e;
        } else {
            self.heap.push(e);
        }
    }

    /// Whether the next event to pop is the near set's (else the heap's).
    #[inline]
    fn near_first(&self) -> bool {
        match (self.near.last(), self.heap.peek()) {
            (Some(n), Some(h)) => n.before(h),
            (n, _) => n.is_some(),
        }
    }

    /// The event that pops next, without popping it.
    #[inline]
    fn peek(&self) -> Option<&Entry<E>> {
        if self.near_first() {
            self.near.last()
        } else {
            self.heap.peek()
        }
    }

    /// Whether an event due at `at`, scheduled now, would be the next to
    /// pop: the queue is unperturbed and every pending event is due later
    /// (one due at `at` itself holds an earlier key, so it would pop
    /// first).
    #[inline]
    pub fn would_pop_next(&self, at: Time) -> bool {
        self.perturbation.is_none() && self.peek().is_none_or(|e| at < e.at)
    }

    /// Schedules and at once pops an event due at `at` that
    /// [`Self::would_pop_next`], without queueing it: the clock moves to
    /// `at`, the event takes its key and counts as popped, exactly as if
    /// it had gone through the queue. Its owner then handles it.
    #[inline]
    pub fn pass_through(&mut self, at: Time) {
        debug_assert!(at >= self.now && self.would_pop_next(at));
        self.seq += 1;
        self.now = at;
        self.popped += 1;
    }

    /// Schedules a message in flight at `at`: exactly `at` normally, up to
    /// the perturbation's jitter later in a perturbed queue.
    #[inline]
    pub fn schedule_async(&mut self, at: Time, event: E) {
        let jitter = self.draw_jitter();
        self.schedule(at.saturating_add(jitter), event);
    }

    /// How late a perturbed queue delivers the next message in flight (0
    /// unperturbed): one draw per message, whatever bounds it later.
    #[inline]
    fn draw_jitter(&mut self) -> Time {
        match &mut self.perturbation {
            Some(p) if p.max_jitter > 0 => p.rng.next_u64() % (p.max_jitter + 1),
            _ => 0,
        }
    }

    /// [`Self::schedule_async`] `delay` after now.
    #[inline]
    pub fn schedule_in_async(&mut self, delay: Time, event: E) {
        self.schedule_async(self.now.saturating_add(delay), event);
    }

    /// A message in flight `delay` after now that the hardware guarantees
    /// to deliver within `max_delay` (an IPI's delivery bound): a perturbed
    /// queue delays it by at most `max_delay - delay`. The jitter is drawn
    /// as for any message, so the other messages' draws do not move.
    #[inline]
    pub fn schedule_in_async_within(&mut self, delay: Time, max_delay: Time, event: E) {
        let jitter = self.draw_jitter();
        let slack = max_delay.saturating_sub(delay);
        let at = self
            .now
            .saturating_add(delay)
            .saturating_add(jitter.min(slack));
        self.schedule(at, event);
    }

    /// Schedules `event` `delay` after now.
    #[inline]
    pub fn schedule_in(&mut self, delay: Time, event: E) {
        self.schedule(self.now.saturating_add(delay), event);
    }

    /// Pops the next event, advancing the clock, unless it lies after `until`.
    #[inline]
    pub fn pop_until(&mut self, until: Time) -> Option<(Time, E)> {
        let near_first = self.near_first();
        let next = if near_first {
            self.near.last()
        } else {
            self.heap.peek()
        };
        if next?.at > until {
            return None;
        }
        let e = if near_first {
            self.near.pop()?
        } else {
            self.heap.pop()?
        };
        self.now = e.at;
        self.popped += 1;
        Some((e.at, e.event))
    }

    /// Advances the clock to `t` (end of a run) if nothing earlier is pending.
    pub fn advance_to(&mut self, t: Time) {
        if self.peek().is_none_or(|e| e.at >= t) {
            self.now = self.now.max(t);
        }
    }

    /// The pending events with their times, in no particular order.
    pub fn pending(&self) -> impl Iterator<Item = (Time, &E)> {
        self.entries().map(|e| (e.at, &e.event))
    }

    fn entries(&self) -> impl Iterator<Item = &Entry<E>> {
        self.near.iter().chain(self.heap.iter())
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.heap.len() + self.near.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.near.is_empty() && self.heap.is_empty()
    }

    /// Events popped since creation (the engine's work counter).
    pub fn popped(&self) -> u64 {
        self.popped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pops_in_time_order_and_fifo_on_ties() {
        let mut q = EventQueue::with_capacity(8);
        q.schedule(30, 'c');
        q.schedule(10, 'a');
        q.schedule(30, 'd');
        q.schedule(10, 'b');
        let order: Vec<char> = std::iter::from_fn(|| q.pop_until(u64::MAX).map(|e| e.1)).collect();
        assert_eq!(order, vec!['a', 'b', 'c', 'd']);
        assert_eq!(q.now(), 30);
        assert_eq!(q.popped(), 4);
    }

    #[test]
    fn past_events_are_clamped_to_now() {
        let mut q = EventQueue::with_capacity(4);
        q.schedule(100, 1);
        assert_eq!(q.pop_until(u64::MAX), Some((100, 1)));
        q.schedule(50, 2);
        assert_eq!(q.pop_until(u64::MAX), Some((100, 2)));
    }

    #[test]
    fn a_reserved_key_pops_where_the_event_would_have_if_scheduled_then() {
        let mut q = EventQueue::with_capacity(8);
        q.schedule(50, 'a');
        let key = q.reserve();
        q.schedule(50, 'c');
        q.schedule(10, 'x');
        assert_eq!(q.pop_until(u64::MAX), Some((10, 'x')));
        // Queued later, at 10, it still pops between 'a' and 'c'.
        q.schedule_reserved(50, key, 'b');
        let order: Vec<char> = std::iter::from_fn(|| q.pop_until(u64::MAX).map(|e| e.1)).collect();
        assert_eq!(order, ['a', 'b', 'c']);
        // Reserving took the key an event scheduled then would have had:
        // events scheduled afterwards keep theirs.
        let mut r = EventQueue::with_capacity(8);
        r.schedule(50, 'a');
        r.schedule(50, 'b');
        r.schedule(50, 'c');
        let keys = |q: &EventQueue<char>| {
            let mut k: Vec<(u64, char)> = q.entries().map(|e| (e.seq, e.event)).collect();
            k.sort_unstable();
            k
        };
        let mut q = EventQueue::with_capacity(8);
        q.schedule(50, 'a');
        let key = q.reserve();
        q.schedule(50, 'c');
        q.schedule_reserved(50, key, 'b');
        assert_eq!(keys(&q), keys(&r));
        assert_eq!(q.pending().filter(|e| *e.1 == 'b').count(), 1);
    }

    #[test]
    fn pop_until_respects_horizon() {
        let mut q = EventQueue::with_capacity(4);
        q.schedule(100, 1);
        assert_eq!(q.pop_until(99), None);
        assert_eq!(q.now(), 0);
        q.advance_to(99);
        assert_eq!(q.now(), 99);
        assert_eq!(q.pop_until(100), Some((100, 1)));
    }

    #[test]
    fn perturbation_shuffles_ties_and_delays_async_events_within_bounds() {
        let order = |seed: u64| {
            let mut q = EventQueue::with_capacity(16);
            q.perturb(seed, 5, true);
            for i in 0..8 {
                q.schedule(10, i);
            }
            q.schedule_async(20, 100);
            let v: Vec<(u64, i32)> = std::iter::from_fn(|| q.pop_until(u64::MAX)).collect();
            v
        };
        let a = order(1);
        assert_eq!(a, order(1), "same perturbation seed, same order");
        let ties: Vec<i32> = a.iter().filter(|e| e.0 == 10).map(|e| e.1).collect();
        assert_eq!(ties.len(), 8);
        // Some seed gives a non-FIFO order; the async event stays in [20, 25].
        assert!((1..20).any(|s| {
            let t: Vec<i32> = order(s).iter().filter(|e| e.0 == 10).map(|e| e.1).collect();
            t != (0..8).collect::<Vec<_>>()
        }));
        for s in 1..50 {
            let (t, _) = *order(s).last().unwrap();
            assert!((20..=25).contains(&t), "{t}");
        }
        // Unperturbed, schedule_async is schedule.
        let mut q = EventQueue::with_capacity(2);
        q.schedule_async(7, 1);
        assert_eq!(q.pop_until(u64::MAX), Some((7, 1)));
    }

    #[test]
    fn a_message_with_a_delivery_bound_is_perturbed_within_it() {
        let mut latest = 0;
        for seed in 1..200 {
            let mut q = EventQueue::with_capacity(4);
            q.perturb(seed, 1_000, false);
            // Nominal 10, at the latest 14, in a queue that jitters by up
            // to 1000.
            q.schedule_in_async_within(10, 14, 1);
            let (t, _) = q.pop_until(u64::MAX).unwrap();
            assert!((10..=14).contains(&t), "{t}");
            latest = latest.max(t);
        }
        assert_eq!(latest, 14, "the bound is reached, not only approached");
        // Unperturbed: the nominal time.
        let mut q = EventQueue::with_capacity(2);
        q.schedule_in_async_within(10, 14, 1);
        assert_eq!(q.pop_until(u64::MAX), Some((10, 1)));
    }

    /// The reference order: a plain heap of (time, key, id), with the keys
    /// and jitters a queue perturbed by `p` = (seed, max_jitter,
    /// shuffle_ties) draws, in the same order.
    struct Reference {
        heap: BinaryHeap<std::cmp::Reverse<(Time, u64, usize)>>,
        now: Time,
        seq: u64,
        p: Option<(RngStream, Time, bool)>,
    }

    impl Reference {
        fn key(&mut self) -> u64 {
            self.seq += 1;
            match &mut self.p {
                Some((rng, _, true)) => rng.next_u64(),
                _ => self.seq,
            }
        }
        fn jitter(&mut self) -> Time {
            match &mut self.p {
                Some((rng, j, _)) if *j > 0 => rng.next_u64() % (*j + 1),
                _ => 0,
            }
        }
        fn push(&mut self, at: Time, key: u64, id: usize) {
            self.heap
                .push(std::cmp::Reverse((at.max(self.now), key, id)));
        }
        fn pop_until(&mut self, until: Time) -> Option<(Time, usize)> {
            let std::cmp::Reverse((at, _, id)) = *self.heap.peek()?;
            if at > until {
                return None;
            }
            self.heap.pop();
            self.now = at;
            Some((at, id))
        }
    }

    proptest! {
        /// The near set never changes the order: under random schedules
        /// (plain, async, reserved then queued later, in the past), pops
        /// with random horizons and every perturbation mode, the queue pops
        /// exactly what a plain heap of (time, key) pops.
        #[test]
        fn near_set_pops_in_plain_heap_order(
            ops in proptest::collection::vec((0u8..7, 0u64..40), 0..400),
            perturbation in proptest::option::of((any::<u64>(), 0u64..8, any::<bool>())),
        ) {
            let mut q = EventQueue::with_capacity(2);
            let mut r = Reference { heap: BinaryHeap::new(), now: 0, seq: 0, p: None };
            if let Some((seed, jitter, shuffle)) = perturbation {
                q.perturb(seed, jitter, shuffle);
                r.p = Some((RngStream::new(seed, "engine.perturbation"), jitter, shuffle));
            }
            let mut reserved: Vec<(u64, usize)> = Vec::new();
            for (id, (op, t)) in ops.into_iter().enumerate() {
                let now = q.now();
                prop_assert_eq!(now, r.now);
                match op {
                    // A time that may lie in the past (clamped).
                    0 => {
                        q.schedule(t, id);
                        let k = r.key();
                        r.push(t, k, id);
                    }
                    1 => {
                        q.schedule_in(t, id);
                        let k = r.key();
                        r.push(now + t, k, id);
                    }
                    2 => {
                        q.schedule_in_async(t, id);
                        let j = r.jitter();
                        let k = r.key();
                        r.push(now + t + j, k, id);
                    }
                    3 => {
                        let k = q.reserve();
                        prop_assert_eq!(k, r.key());
                        reserved.push((k, id));
                    }
                    4 => {
                        if let Some((k, id)) = reserved.pop() {
                            q.schedule_reserved(now + t, k, id);
                            r.push(now + t, k, id);
                        }
                    }
                    // An event that would pop next passes through: the
                    // same as scheduling it and popping it at once.
                    6 => {
                        let passes = q.would_pop_next(now + t);
                        prop_assert!(!(passes && q.perturbation.is_some()));
                        if passes {
                            q.pass_through(now + t);
                            let k = r.key();
                            r.push(now + t, k, id);
                            prop_assert_eq!(r.pop_until(u64::MAX), Some((now + t, id)));
                            prop_assert_eq!(q.now(), now + t);
                        }
                    }
                    _ => {
                        prop_assert_eq!(q.pop_until(now + t), r.pop_until(now + t));
                    }
                }
                prop_assert_eq!(q.len(), r.heap.len());
                let mut pending: Vec<usize> = q.pending().map(|e| *e.1).collect();
                let mut want: Vec<usize> = r.heap.iter().map(|e| e.0 .2).collect();
                pending.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(pending, want);
            }
            loop {
                let got = q.pop_until(u64::MAX);
                prop_assert_eq!(got, r.pop_until(u64::MAX));
                if got.is_none() {
                    break;
                }
            }
            prop_assert!(q.is_empty());
        }

        #[test]
        fn output_is_sorted_and_stable(times in proptest::collection::vec(0u64..50, 0..200)) {
            let mut q = EventQueue::with_capacity(4);
            for (i, t) in times.iter().enumerate() { q.schedule(*t, i); }
            let mut last = (0u64, 0usize);
            let mut first = true;
            let mut n = 0;
            while let Some((t, i)) = q.pop_until(u64::MAX) {
                if !first {
                    prop_assert!(t > last.0 || (t == last.0 && i > last.1));
                }
                prop_assert_eq!(times[i], t);
                last = (t, i);
                first = false;
                n += 1;
            }
            prop_assert_eq!(n, times.len());
        }
    }
}
