//! A virtio 1.x split virtqueue (spec §2.7) as it sits in guest memory, with
//! both notification-suppression mechanisms: the ring flags
//! (VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY; §2.7.7, §2.7.10) and
//! VIRTIO_RING_F_EVENT_IDX (`used_event` / `avail_event`).
//!
//! [`SplitRing`] is the shared memory: descriptor table, available ring and
//! used ring. The driver (guest) and the device (vhost in the host) each keep
//! private shadow state ([`DriverState`], [`DeviceState`]) and touch only
//! the ring fields the spec gives them: the driver writes descriptors, the
//! available ring and `used_event`; the device writes the used ring and
//! `avail_event`. Indices are free-running u16 (slot = index mod size).

/// VRING_DESC_F_WRITE: the device writes this buffer (receive buffers).
pub const VRING_DESC_F_WRITE: u16 = 2;
/// VRING_AVAIL_F_NO_INTERRUPT: the driver asks not to be interrupted.
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;
/// VRING_USED_F_NO_NOTIFY: the device asks not to be kicked.
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;

/// Virtqueue errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VirtioError {
    /// The queue size is not a power of two in 1..=32768 (§2.7).
    #[error("virtqueue size {0} must be a power of two in 1..=32768")]
    BadSize(u16),
    /// No free descriptor.
    #[error("virtqueue full")]
    Full,
}

/// One descriptor-table entry (§2.7.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Guest-physical address (the model keeps buffers by index, so this
    /// is the descriptor's own index).
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// VRING_DESC_F_* flags.
    pub flags: u16,
    /// Next descriptor of a chain (free-list link while unused).
    pub next: u16,
}

/// One used-ring element (§2.7.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the returned buffer.
    pub id: u32,
    /// Bytes the device wrote into it.
    pub len: u32,
}

/// The virtqueue's memory, shared by driver and device.
#[derive(Clone, Debug)]
pub struct SplitRing {
    /// Descriptor table.
    pub desc: Vec<Desc>,
    /// Available ring: flags.
    pub avail_flags: u16,
    /// Available ring: where the driver puts the next entry.
    pub avail_idx: u16,
    /// Available ring entries (descriptor heads).
    pub avail_ring: Vec<u16>,
    /// `used_event` (EVENT_IDX): interrupt me when used idx passes this.
    pub used_event: u16,
    /// Used ring: flags.
    pub used_flags: u16,
    /// Used ring: where the device puts the next entry.
    pub used_idx: u16,
    /// Used ring entries.
    pub used_ring: Vec<UsedElem>,
    /// `avail_event` (EVENT_IDX): kick me when avail idx passes this.
    pub avail_event: u16,
}

/// `vring_need_event` (§2.7.10): whether moving an index from `old` to
/// `new` crossed `event_idx`, i.e. `event_idx` is in `[old, new)`.
pub fn vring_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The driver's private state.
#[derive(Clone, Debug)]
pub struct DriverState {
    free_head: u16,
    num_free: u16,
    /// Next used index the driver will consume.
    last_used_idx: u16,
    /// Avail index at the last `kick_prepare`.
    kicked_avail: u16,
    /// Buffers added since the last `kick_prepare` (Linux's `num_added`).
    added: u16,
    event_idx: bool,
}

/// The device's private state.
#[derive(Clone, Debug)]
pub struct DeviceState {
    /// Next available index the device will consume.
    last_avail_idx: u16,
    /// Used index when the driver was last signalled (vhost's
    /// `signalled_used`), valid once a signal decision was made.
    signalled_used: u16,
    signalled_used_valid: bool,
    event_idx: bool,
}

/// A virtqueue: the shared ring and each side's state.
#[derive(Clone, Debug)]
pub struct Virtqueue {
    /// Guest memory.
    pub ring: SplitRing,
    /// The driver's side.
    pub driver: DriverState,
    /// The device's side.
    pub device: DeviceState,
    size: u16,
}

impl Virtqueue {
    /// A queue of `size` entries; `event_idx` = VIRTIO_RING_F_EVENT_IDX
    /// negotiated.
    pub fn new(size: u16, event_idx: bool) -> Result<Self, VirtioError> {
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(VirtioError::BadSize(size));
        }
        let n = size as usize;
        let desc = (0..size)
            .map(|i| Desc {
                addr: i as u64,
                next: i.wrapping_add(1),
                ..Default::default()
            })
            .collect();
        Ok(Virtqueue {
            ring: SplitRing {
                desc,
                avail_flags: 0,
                avail_idx: 0,
                avail_ring: vec![0; n],
                used_event: 0,
                used_flags: 0,
                used_idx: 0,
                used_ring: vec![UsedElem::default(); n],
                avail_event: 0,
            },
            driver: DriverState {
                free_head: 0,
                num_free: size,
                last_used_idx: 0,
                kicked_avail: 0,
                added: 0,
                event_idx,
            },
            device: DeviceState {
                last_avail_idx: 0,
                signalled_used: 0,
                signalled_used_valid: false,
                event_idx,
            },
            size,
        })
    }

    /// Entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    fn slot(&self, idx: u16) -> usize {
        (idx & (self.size - 1)) as usize
    }

    // ---- driver ----

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.driver.num_free
    }

    /// Adds a one-descriptor buffer of `len` bytes and makes it available
    /// (not yet published to the device's view of `avail_idx` until
    /// [`kick_prepare`](Self::kick_prepare) — Linux writes the index there).
    pub fn add_buf(&mut self, len: u32, device_writable: bool) -> Result<u16, VirtioError> {
        if self.driver.num_free == 0 {
            return Err(VirtioError::Full);
        }
        let head = self.driver.free_head;
        let d = &mut self.ring.desc[head as usize];
        self.driver.free_head = d.next;
        self.driver.num_free -= 1;
        d.len = len;
        d.flags = if device_writable {
            VRING_DESC_F_WRITE
        } else {
            0
        };
        // Place it in the next available slot (§2.7.13.2); the index is
        // published by kick_prepare.
        let pending = self.pending_avail();
        let slot = self.slot(self.ring.avail_idx.wrapping_add(pending));
        self.ring.avail_ring[slot] = head;
        self.driver.added += 1;
        Ok(head)
    }

    fn pending_avail(&self) -> u16 {
        self.driver.added
    }

    /// `virtqueue_kick_prepare`: publish the added buffers (avail idx), then
    /// decide whether the device wants a notification — with EVENT_IDX, if
    /// `avail_event` lies among the buffers just published; without it,
    /// unless the device set VRING_USED_F_NO_NOTIFY.
    pub fn kick_prepare(&mut self) -> bool {
        let old = self.driver.kicked_avail;
        let new = self.ring.avail_idx.wrapping_add(self.driver.added);
        self.ring.avail_idx = new;
        self.driver.added = 0;
        self.driver.kicked_avail = new;
        if old == new {
            return false;
        }
        if self.driver.event_idx {
            vring_need_event(self.ring.avail_event, new, old)
        } else {
            self.ring.used_flags & VRING_USED_F_NO_NOTIFY == 0
        }
    }

    /// Whether the device has returned buffers the driver has not taken.
    pub fn has_used(&self) -> bool {
        self.ring.used_idx != self.driver.last_used_idx
    }

    /// Takes the next used buffer: its head descriptor and the length the
    /// device wrote. The descriptor returns to the free list.
    pub fn get_used(&mut self) -> Option<(u16, u32)> {
        if !self.has_used() {
            return None;
        }
        let e = self.ring.used_ring[self.slot(self.driver.last_used_idx)];
        self.driver.last_used_idx = self.driver.last_used_idx.wrapping_add(1);
        let head = e.id as u16;
        self.ring.desc[head as usize].next = self.driver.free_head;
        self.driver.free_head = head;
        self.driver.num_free += 1;
        if self.driver.event_idx && self.ring.avail_flags & VRING_AVAIL_F_NO_INTERRUPT == 0 {
            // Linux keeps used_event trailing the consumer while callbacks
            // are on, so the next used buffer interrupts.
            self.ring.used_event = self.driver.last_used_idx;
        }
        Some((head, e.len))
    }

    /// `virtqueue_disable_cb`: ask not to be interrupted. The flag is the
    /// mechanism without EVENT_IDX and a hint with it (Linux sets it either
    /// way; the device ignores it under EVENT_IDX, and `used_event` stops
    /// moving).
    pub fn disable_cb(&mut self) {
        self.ring.avail_flags |= VRING_AVAIL_F_NO_INTERRUPT;
    }

    /// `virtqueue_enable_cb`: ask for an interrupt at the next used buffer.
    /// Returns false if used buffers are already pending (the caller must
    /// process them, since no interrupt will come for those).
    pub fn enable_cb(&mut self) -> bool {
        self.ring.avail_flags &= !VRING_AVAIL_F_NO_INTERRUPT;
        self.ring.used_event = self.driver.last_used_idx;
        !self.has_used()
    }

    /// `virtqueue_enable_cb_delayed`: ask for an interrupt once about 3/4
    /// of the outstanding buffers are used. Returns false if that many are
    /// already used.
    pub fn enable_cb_delayed(&mut self) -> bool {
        self.ring.avail_flags &= !VRING_AVAIL_F_NO_INTERRUPT;
        let outstanding = self.ring.avail_idx.wrapping_sub(self.driver.last_used_idx);
        let bufs = outstanding.wrapping_mul(3) / 4;
        let event = self.driver.last_used_idx.wrapping_add(bufs);
        self.ring.used_event = event;
        // Used idx already past the event: no interrupt will come.
        self.ring.used_idx.wrapping_sub(self.driver.last_used_idx) <= bufs
    }

    // ---- device ----

    /// How many buffers the driver made available that the device has not
    /// taken (vhost-vsock counts them before splitting a packet).
    pub fn num_avail(&self) -> u16 {
        self.ring.avail_idx.wrapping_sub(self.device.last_avail_idx)
    }

    /// Whether the driver has made buffers available the device has not
    /// taken.
    pub fn has_avail(&self) -> bool {
        self.ring.avail_idx != self.device.last_avail_idx
    }

    /// Takes the next available buffer: head and length.
    pub fn pop_avail(&mut self) -> Option<(u16, u32)> {
        if !self.has_avail() {
            return None;
        }
        let head = self.ring.avail_ring[self.slot(self.device.last_avail_idx)];
        self.device.last_avail_idx = self.device.last_avail_idx.wrapping_add(1);
        Some((head, self.ring.desc[head as usize].len))
    }

    /// Returns buffer `head` with `len` bytes written to the used ring.
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = self.slot(self.ring.used_idx);
        self.ring.used_ring[slot] = UsedElem {
            id: head as u32,
            len,
        };
        self.ring.used_idx = self.ring.used_idx.wrapping_add(1);
    }

    /// `vhost_notify`: whether to interrupt the driver for the buffers used
    /// since the last decision. With EVENT_IDX: if `used_event` lies among
    /// them; without: unless VRING_AVAIL_F_NO_INTERRUPT is set.
    pub fn need_signal(&mut self) -> bool {
        if !self.device.event_idx {
            return self.ring.avail_flags & VRING_AVAIL_F_NO_INTERRUPT == 0;
        }
        let new = self.ring.used_idx;
        let old = self.device.signalled_used;
        let valid = self.device.signalled_used_valid;
        self.device.signalled_used = new;
        self.device.signalled_used_valid = true;
        if !valid {
            return true;
        }
        vring_need_event(self.ring.used_event, new, old)
    }

    /// `vhost_disable_notify`: ask not to be kicked. Without EVENT_IDX the
    /// flag; with it nothing: `avail_event` simply stays behind.
    pub fn disable_notify(&mut self) {
        if !self.device.event_idx {
            self.ring.used_flags |= VRING_USED_F_NO_NOTIFY;
        }
    }

    /// Keep the driver from kicking until notifications are enabled again,
    /// whatever it adds (ES2's polling mode, docs/papers.md ES2 §2.3):
    /// without EVENT_IDX the flag; with it, `avail_event` is set to an
    /// index the driver has already passed, so no publication crosses it.
    pub fn suppress_notify(&mut self) {
        if self.device.event_idx {
            self.ring.avail_event = self.device.last_avail_idx.wrapping_sub(1);
        } else {
            self.ring.used_flags |= VRING_USED_F_NO_NOTIFY;
        }
    }

    /// `vhost_enable_notify`: ask to be kicked for the next buffer, then
    /// look again. Returns true if buffers were made available meanwhile
    /// (no kick will come for them: the caller must keep processing).
    pub fn enable_notify(&mut self) -> bool {
        if self.device.event_idx {
            self.ring.avail_event = self.device.last_avail_idx;
        } else {
            self.ring.used_flags &= !VRING_USED_F_NO_NOTIFY;
        }
        self.has_avail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn need_event_truth_table() {
        // event in [old, new) → true
        assert!(vring_need_event(5, 6, 5));
        assert!(vring_need_event(5, 10, 3));
        assert!(!vring_need_event(5, 5, 3));
        assert!(!vring_need_event(10, 9, 3));
        // wraparound: old 65534, new 2 covers 65535, 0, 1
        assert!(vring_need_event(0, 2, 65534));
        assert!(vring_need_event(65535, 2, 65534));
        assert!(!vring_need_event(2, 2, 65534));
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert_eq!(
            Virtqueue::new(0, true).unwrap_err(),
            VirtioError::BadSize(0)
        );
        assert_eq!(
            Virtqueue::new(100, true).unwrap_err(),
            VirtioError::BadSize(100)
        );
        assert!(Virtqueue::new(256, false).is_ok());
    }

    #[test]
    fn full_and_empty() {
        let mut q = Virtqueue::new(4, true).unwrap();
        for _ in 0..4 {
            q.add_buf(100, false).unwrap();
        }
        assert_eq!(q.add_buf(100, false), Err(VirtioError::Full));
        assert!(q.get_used().is_none());
        assert!(
            q.pop_avail().is_none(),
            "nothing published before kick_prepare"
        );
        q.kick_prepare();
        assert_eq!(q.pop_avail(), Some((0, 100)));
    }

    #[test]
    fn indices_wrap_past_65536() {
        let mut q = Virtqueue::new(8, true).unwrap();
        for i in 0..70_000u32 {
            let h = q.add_buf(i, false).unwrap();
            q.kick_prepare();
            let (d, len) = q.pop_avail().unwrap();
            assert_eq!((d, len), (h, i));
            q.push_used(d, len);
            assert_eq!(q.get_used(), Some((h, i)));
        }
        assert_eq!(q.num_free(), 8);
        assert_eq!(q.ring.avail_idx, (70_000u32 % 65536) as u16);
    }

    #[test]
    fn event_idx_kick_once_per_enable() {
        let mut q = Virtqueue::new(16, true).unwrap();
        // The device enabled notifications at index 0.
        assert!(!q.enable_notify());
        q.add_buf(1, false).unwrap();
        assert!(q.kick_prepare(), "first buffer after enable kicks");
        q.add_buf(1, false).unwrap();
        assert!(!q.kick_prepare(), "device has not re-enabled: no kick");
        // The device drains and re-enables at the current index.
        while q.pop_avail().is_some() {}
        assert!(!q.enable_notify());
        q.add_buf(1, false).unwrap();
        q.add_buf(1, false).unwrap();
        assert!(q.kick_prepare(), "a burst crossing avail_event kicks once");
    }

    #[test]
    fn flag_mode_kicks_unless_no_notify() {
        let mut q = Virtqueue::new(16, false).unwrap();
        q.add_buf(1, false).unwrap();
        assert!(q.kick_prepare());
        q.disable_notify();
        q.add_buf(1, false).unwrap();
        assert!(!q.kick_prepare());
        q.pop_avail();
        q.pop_avail();
        assert!(!q.enable_notify());
        q.add_buf(1, false).unwrap();
        assert!(q.kick_prepare());
    }

    #[test]
    fn interrupt_suppression_both_modes() {
        for event_idx in [false, true] {
            let mut q = Virtqueue::new(16, event_idx).unwrap();
            for _ in 0..4 {
                q.add_buf(1, true).unwrap();
            }
            q.kick_prepare();
            q.disable_cb();
            let (h, _) = q.pop_avail().unwrap();
            q.push_used(h, 1);
            let first = q.need_signal();
            // Without EVENT_IDX the flag suppresses; with it, the first
            // decision always signals (signalled_used not yet valid).
            assert_eq!(first, event_idx, "event_idx={event_idx}");
            let (h, _) = q.pop_avail().unwrap();
            q.push_used(h, 1);
            assert!(!q.need_signal(), "disabled callbacks: no signal");
            // Driver re-enables with buffers pending: told to poll.
            assert!(!q.enable_cb());
            while q.get_used().is_some() {}
            assert!(q.enable_cb());
            let (h, _) = q.pop_avail().unwrap();
            q.push_used(h, 1);
            assert!(q.need_signal(), "enabled: signal");
        }
    }

    #[test]
    fn enable_cb_delayed_waits_for_three_quarters() {
        let mut q = Virtqueue::new(16, true).unwrap();
        for _ in 0..8 {
            q.add_buf(1, false).unwrap();
        }
        q.kick_prepare();
        q.need_signal(); // validate signalled_used
        assert!(q.enable_cb_delayed()); // event at 6 used
        let mut signals = 0;
        for _ in 0..8 {
            let (h, _) = q.pop_avail().unwrap();
            q.push_used(h, 0);
            if q.need_signal() {
                signals += 1;
                assert_eq!(q.ring.used_idx, 7, "signal once used passes 6");
            }
        }
        assert_eq!(signals, 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add,
        Kick,
        Get,
        DisableCb,
        EnableCb,
        Pop,
        PushSignal,
        DisableNotify,
        EnableNotify,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Add),
            Just(Op::Kick),
            Just(Op::Get),
            Just(Op::DisableCb),
            Just(Op::EnableCb),
            Just(Op::Pop),
            Just(Op::PushSignal),
            Just(Op::DisableNotify),
            Just(Op::EnableNotify),
        ]
    }

    proptest! {
        /// Random interleavings of both sides: buffers come back exactly
        /// once in order, and neither side sleeps through work the other
        /// published (the driver sleeps only after enable_cb() = true, the
        /// device only after enable_notify() = false).
        #[test]
        fn no_loss_no_lost_wakeup(ops in proptest::collection::vec(op(), 1..400), event_idx in any::<bool>()) {
            let mut q = Virtqueue::new(8, event_idx).unwrap();
            let mut next_len = 0u32;
            let mut inflight: std::collections::VecDeque<(u16, u32)> = Default::default();
            let mut popped: std::collections::VecDeque<(u16, u32)> = Default::default();
            let mut expect_used: std::collections::VecDeque<(u16, u32)> = Default::default();
            let mut driver_asleep = false;
            let mut device_asleep = false;
            for o in ops {
                match o {
                    Op::Add | Op::Kick | Op::Get | Op::DisableCb | Op::EnableCb => driver_asleep = false,
                    _ => device_asleep = false,
                }
                // (the device's state before this op matters for a kick)
                match o {
                    Op::Add => {
                        if let Ok(h) = q.add_buf(next_len, true) {
                            inflight.push_back((h, next_len));
                            next_len += 1;
                        }
                    }
                    Op::Kick => {
                        let had = q.driver.added > 0;
                        let kick = q.kick_prepare();
                        if kick { device_asleep = false; }
                        if had && device_asleep {
                            prop_assert!(false, "device asleep, buffers published, no kick");
                        }
                    }
                    Op::Get => {
                        if let Some(x) = q.get_used() {
                            prop_assert_eq!(Some(x), expect_used.pop_front());
                        }
                    }
                    Op::DisableCb => q.disable_cb(),
                    Op::EnableCb => {
                        if q.enable_cb() { driver_asleep = true; } else {
                            while let Some(x) = q.get_used() {
                                prop_assert_eq!(Some(x), expect_used.pop_front());
                            }
                        }
                    }
                    Op::Pop => {
                        if let Some((h, len)) = q.pop_avail() {
                            prop_assert_eq!(Some((h, len)), inflight.pop_front());
                            popped.push_back((h, len));
                        }
                    }
                    Op::PushSignal => {
                        if let Some((h, len)) = popped.pop_front() {
                            q.push_used(h, len);
                            expect_used.push_back((h, len));
                            let sig = q.need_signal();
                            if sig { driver_asleep = false; }
                            if driver_asleep {
                                prop_assert!(false, "driver asleep, buffer used, no interrupt");
                            }
                        }
                    }
                    Op::DisableNotify => q.disable_notify(),
                    Op::EnableNotify => {
                        if q.enable_notify() {
                            // Work slipped in: the device keeps going.
                            device_asleep = false;
                        } else {
                            device_asleep = true;
                        }
                    }
                }
                // A sleeping side stays asleep only while the other side
                // has not yet published anything new for it.
                if driver_asleep && q.has_used() {
                    prop_assert!(false, "driver slept with used buffers pending");
                }
                if device_asleep && q.has_avail() {
                    prop_assert!(false, "device slept with buffers available");
                }
            }
        }
    }
}
