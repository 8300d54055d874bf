//! vCanal's host side (vcanal.md): the shared-memory channel a VM's
//! libCanal enqueues INRs on ([`channel`]), the service that polls the
//! channels, validates and issues the calls ([`service`]), the request
//! translator's address/port hash ([`translator`]) and the channel
//! scheduler ([`scheduler`]). The guest side is
//! [`crate::guest::libcanal`]. These are mechanisms only: the event loop,
//! the host thread that runs the service and the host TCP/UDP stack that
//! executes calls belong to the world, which charges [`VcanalCosts`].

pub mod channel;
pub mod scheduler;
pub mod service;
pub mod translator;

use crate::engine::Time;
use service::TurnReport;

/// Primitive costs of vCanal's data path, filled by the caller from the
/// calibration file. vcanal.md §5 gives **no** per-call, queue or stack
/// cost ("take them from other sources"); each field says what the paper
/// does give, so calibration can cite its own source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcanalCosts {
    /// Guest: libCanal intercepts a call on an `AF_VSOCKET` socket and
    /// fills an INR (§2.2 step 1). No number in §5.
    pub inr_build: Time,
    /// Guest: one enqueue, a CAS on the tail and the publish (§2.4,
    /// lock-free, "no exits on enqueue"). No number in §5.
    pub enqueue: Time,
    /// Guest: re-reading a line the other core writes (a cache-to-cache
    /// transfer): the enqueuer's retry on a full ring (§7). No number.
    pub completion_poll: Time,
    /// Guest: one iteration of the wait loop while the INR's line is
    /// unchanged (§2.5; §5 gives only the count, 100 polls by default):
    /// the state word still sits in the waiter's own cache, so an
    /// iteration is a load that hits, the compare and the loop's pause.
    pub spin_poll: Time,
    /// Guest: the kernel's part of a `sched_yield()` with nothing else to
    /// run, past the system call's entry and exit: what libCanal's `yield`
    /// reading adds to each wait-loop iteration (§2.5 does not say what
    /// an iteration does besides the poll).
    pub sched_yield: Time,
    /// Guest: a hybrid-address-space lookup that hits (§2.6). No number.
    pub radix_lookup: Time,
    /// Guest: a miss's GVA → GPA walk through the helper driver (§2.6;
    /// §5: "guest page walk through the guest kernel (no number)"),
    /// including the entry into the driver.
    pub page_walk: Time,
    /// Host: taking one ring entry and copying its INR (§2.4). No number.
    pub dequeue: Time,
    /// Host: checking one INR and handing it on, per INR taken (§2.4's
    /// polling-thread loop: scheduler → dequeue → translator → pool). No
    /// number.
    pub service_per_call: Time,
    /// Host: one IP/port hash translation (§2.3; §5: once per TCP
    /// connection, ports < 64K; no time).
    pub port_translation: Time,
    /// Host: writing a result and the flag back into an INR (§2.2 step 3).
    /// No number.
    pub completion_write: Time,
    /// Host: a polling round that finds nothing. Not in vcanal.md; the
    /// peers digest (kvm-arm-and-peers.md §5) cites an idle poll round of
    /// a DPDK/vhost-user poller at 438 ns (yanet2#1683), a proxy.
    pub idle_poll_round: Time,
}

impl VcanalCosts {
    /// Host time of one service turn.
    pub fn turn(&self, r: &TurnReport) -> Time {
        if r.idle() {
            return self.idle_poll_round;
        }
        let taken = r.taken as Time;
        let checked = r.taken.saturating_sub(r.refused) as Time;
        taken * self.dequeue
            + checked * self.service_per_call
            + r.translations as Time * self.port_translation
            + r.rejected as Time * self.completion_write
    }

    /// Guest time to submit one call whose buffer took `hits` cache hits
    /// and `misses` helper-driver walks.
    pub fn submit(&self, hits: u32, misses: u32) -> Time {
        self.inr_build
            + self.enqueue
            + hits as Time * self.radix_lookup
            + misses as Time * (self.radix_lookup + self.page_walk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_add_up_per_item() {
        let c = VcanalCosts {
            inr_build: 1,
            enqueue: 2,
            completion_poll: 3,
            spin_poll: 1,
            sched_yield: 1,
            radix_lookup: 5,
            page_walk: 100,
            dequeue: 7,
            service_per_call: 11,
            port_translation: 13,
            completion_write: 17,
            idle_poll_round: 438,
        };
        assert_eq!(c.turn(&TurnReport::default()), 438);
        let r = TurnReport {
            taken: 4,
            refused: 1,
            rejected: 2,
            queued: 1,
            issued: 1,
            translations: 1,
            ..TurnReport::default()
        };
        assert_eq!(c.turn(&r), 4 * 7 + 3 * 11 + 13 + 2 * 17);
        assert_eq!(c.submit(2, 1), 1 + 2 + 2 * 5 + (5 + 100));
    }
}
