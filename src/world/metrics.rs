//! The run's results: each VM's guest, VF and back-end metrics over the
//! measured interval, the scheduler's and checker's, and the reset at the
//! end of the warm-up that starts that interval.

use super::{net, World};
use crate::engine::{Time, SEC};
use crate::guest::app::Metrics;

impl World {
    pub(super) fn reset_stats(&mut self, now: Time) {
        for vm in &mut self.hv.vms {
            vm.stats = Default::default();
            vm.vcpu_stats.fill(Default::default());
        }
        for c in &mut self.m.cores {
            c.guest_since = c.guest_since.max(now);
        }
        for g in &mut self.guests {
            g.reset_metrics();
        }
        self.timer_exits = Default::default();
        for r in self.hv.redirect.iter_mut().flatten() {
            r.reset_counters();
        }
        if let Some(pv) = &mut self.pv {
            for d in &mut pv.devs {
                d.counters = Default::default();
            }
            for w in &mut pv.workers {
                w.counters = Default::default();
            }
        }
        if let Some(k) = &mut self.kvmtool {
            if let Some(h) = &mut k.host_nic {
                h.counters = Default::default();
            }
            for d in &mut k.devs {
                d.counters = Default::default();
                for t in &mut d.threads {
                    t.busy = 0;
                    t.wakeups = 0;
                }
            }
        }
        self.scheme.reset_metrics();
        if let Some(a) = &mut self.el2 {
            a.reset_stats();
        }
        if let Some(h) = &mut self.hs {
            h.reset_stats();
        }
        if let Some(e) = &mut self.event_exits {
            e.reset();
        }
        for link in &mut self.peers {
            link.peer.reset_metrics();
        }
        for b in &mut self.blk {
            b.backend.counters = Default::default();
        }
        for (vf, base) in self.nic_base.iter_mut().enumerate() {
            *base = self.m.nic.counters(vf as u16).unwrap_or_default();
        }
        let queues = self.m.nic.config().queues;
        for (vf, base) in self.nic_queue_base.iter_mut().enumerate() {
            for q in 0..queues {
                base[usize::from(q)] = self.m.nic.rx_queue_packets(vf as u16, q).unwrap_or(0);
            }
        }
        self.measure_start = now;
        self.checker.descheduled_delay = crate::engine::LatencyHistogram::new();
        self.checker.waited_schedule_in = crate::engine::LatencyHistogram::new();
        self.sched_reset(now);
        self.canal_reset();
        self.vsock_reset();
    }

    /// The run's results.
    pub fn report(&self) -> crate::report::RunReport {
        crate::report::RunReport::from_world(self.snapshot())
    }

    /// One VM's guest and VF metrics over the measured interval.
    pub(super) fn vm_metrics(&self, vm: usize, out: &mut Metrics, dur: f64) {
        let g = &self.guests[vm];
        g.metrics(out);
        let vf = vm as u16;
        let nic = self.m.nic.counters(vf).unwrap_or_default();
        let base = self.nic_base[vm];
        out.insert(
            "nic.rx_packets".into(),
            (nic.rx_packets - base.rx_packets) as f64,
        );
        out.insert(
            "nic.rx_missed".into(),
            (nic.rx_missed - base.rx_missed) as f64,
        );
        let queues = self.m.nic.config().queues;
        if queues > 1 {
            // RSS's spread: each RX queue's frames.
            for q in 0..queues {
                let n = self.m.nic.rx_queue_packets(vf, q).unwrap_or(0)
                    - self.nic_queue_base[vm][usize::from(q)];
                out.insert(format!("nic.rx_packets.q{q}"), n as f64);
            }
        }
        let irqs = nic.interrupts - base.interrupts;
        out.insert("nic.interrupts_per_s".into(), irqs as f64 / dur);
        if irqs > 0 {
            // Received frames per VF interrupt (the NIC's coalescing).
            out.insert(
                "nic.rx_packets_per_interrupt".into(),
                (nic.rx_packets - base.rx_packets) as f64 / irqs as f64,
            );
        }
        let gc = g.counters;
        out.insert("guest.irqs_per_s".into(), gc.irqs as f64 / dur);
        out.insert("guest.rx_packets".into(), gc.rx_packets as f64);
        out.insert("guest.socket_drops".into(), gc.socket_drops as f64);
        out.insert("guest.timer_irqs_per_s".into(), gc.timer_irqs as f64 / dur);
        if g.cpus() > 1 {
            out.insert("guest.ipis_sent_per_s".into(), gc.ipis_sent as f64 / dur);
            out.insert(
                "guest.resched_irqs_per_s".into(),
                gc.resched_irqs as f64 / dur,
            );
        }
        if g.rps_enabled() {
            let r = g.rps_counters();
            for (k, n) in [
                ("guest.call_function_irqs_per_s", r.call_function_irqs),
                ("guest.rps_ipis_per_s", r.ipis),
                ("guest.rps_steered_per_s", r.steered),
                ("guest.rps_steered_remote_per_s", r.steered_remote),
                ("guest.rps_batches_per_s", r.batches),
            ] {
                out.insert(k.into(), n as f64 / dur);
            }
            out.insert("guest.rps_backlog_drops".into(), r.drops as f64);
        }
    }

    /// Each virtio-net back end's counters, as its VM's metrics (VM 0's by
    /// their plain names), and its worker's.
    pub(super) fn vhost_metrics(&self, pv: &net::PvPath, metrics: &mut Metrics, dur: f64) {
        let hybrid = self.scenario.hv.es2_hybrid != crate::hv::es2::Es2Hybrid::Off;
        for d in &pv.devs {
            let v = &d.counters;
            let w = &pv.workers[d.worker].counters;
            let prefix = crate::report::vm_prefix(d.vm);
            let mut put = |k: &str, n: f64| {
                metrics.insert(format!("{prefix}{k}"), n);
            };
            for (k, n) in [
                ("vhost.kicks", v.kicks),
                ("vhost.wakeups", w.wakeups),
                ("vhost.tx_frames", v.tx_frames),
                ("vhost.rx_frames", v.rx_frames),
                ("vhost.signals", v.signals),
                ("vhost.signals_suppressed", v.signals_suppressed),
                ("vhost.tap_drops", v.tap_drops),
                ("vhost.tx_kicks", v.tx_kicks),
                ("vhost.tx_notify_enables", v.tx_notify_enables),
                ("vhost.tx_slipped_in", v.tx_slipped_in),
            ] {
                put(k, n as f64);
            }
            // The driver's side of the same protocol: kicks per frame sent
            // (1 when handle_tx drains the ring before each next frame, 0
            // when it never finds it empty).
            put(
                "vhost.tx_kicks_per_frame",
                if v.tx_frames == 0 {
                    0.0
                } else {
                    v.tx_kicks as f64 / v.tx_frames as f64
                },
            );
            if hybrid {
                put("vhost.quota_requeues", v.quota_requeues as f64);
                put("vhost.polling_turns", v.polling_turns as f64);
                put("vhost.empty_polls", v.empty_polls as f64);
                put("vhost.naps", w.naps as f64);
            }
        }
        {
            // ES2 §7's overhead: the I/O threads' CPU, % of one core.
            let busy: Time = pv.workers.iter().map(|w| w.counters.busy).sum();
            metrics.insert(
                "vhost.io_cpu_pct".into(),
                100.0 * busy as f64 / (dur * SEC as f64).max(1.0),
            );
        }
    }

    /// Each kvm-tools back end's counters, as its VM's metrics (VM 0's by
    /// their plain names), and its threads' CPU.
    pub(super) fn kvmtool_metrics(
        &self,
        k: &super::kvmtool_net::KvmtoolPath,
        metrics: &mut Metrics,
        dur: f64,
    ) {
        use crate::hv::kvmtool_net::Role;
        let ps = (dur * SEC as f64).max(1.0);
        let mut all: Time = 0;
        for d in &k.devs {
            let v = &d.counters;
            let prefix = crate::report::vm_prefix(d.vm);
            let mut put = |k: &str, n: f64| {
                metrics.insert(format!("{prefix}{k}"), n);
            };
            for (key, n) in [
                ("kvmtool.kicks", v.kicks),
                ("kvmtool.ioeventfd_events", v.events),
                ("kvmtool.tx_frames", v.tx_frames),
                ("kvmtool.rx_frames", v.rx_frames),
                ("kvmtool.rx_signals", v.signals[0]),
                ("kvmtool.tx_signals", v.signals[1]),
                ("kvmtool.signals_suppressed", v.signals_suppressed),
                ("kvmtool.lost_cond_signals", v.lost_cond_signals),
                ("kvmtool.tap_drops", v.tap_drops),
                ("kvmtool.rx_read_blocks", v.read_blocks),
            ] {
                put(key, n as f64);
            }
            for r in [Role::Ioeventfd, Role::Tx, Role::Rx] {
                let t = &d.threads[r as usize];
                all += t.busy;
                put(
                    &format!("kvmtool.{}_thread_busy_pct", r.name()),
                    100.0 * t.busy as f64 / ps,
                );
                put(
                    &format!("kvmtool.{}_thread_wakeups_per_s", r.name()),
                    t.wakeups as f64 / dur.max(1e-12),
                );
            }
        }
        // The back end's threads' CPU, % of one core (vhost.io_cpu_pct's
        // counterpart).
        metrics.insert("kvmtool.io_cpu_pct".into(), 100.0 * all as f64 / ps);
        // The host NIC under the bridge: its receive path on its interrupt's
        // core, and the bridge and xmit in the TX threads' writevs.
        if let Some(h) = &k.host_nic {
            let c = &h.counters;
            let per_s = |n: u64| n as f64 / dur.max(1e-12);
            for (key, v) in [
                ("kvmtool.host_nic_irqs_per_s", per_s(c.irqs)),
                ("kvmtool.host_napi_polls_per_s", per_s(c.napi_polls)),
                ("kvmtool.host_rx_frames_per_s", per_s(c.rx_frames)),
                ("kvmtool.host_tx_frames_per_s", per_s(c.tx_frames)),
                ("kvmtool.host_softirq_deferrals", c.softirq_deferrals as f64),
                ("kvmtool.host_rx_busy_pct", 100.0 * c.busy as f64 / ps),
                ("kvmtool.host_tx_busy_pct", 100.0 * c.tx_busy as f64 / ps),
            ] {
                metrics.insert(key.into(), v);
            }
        }
    }

    /// `all.<metric>` for each percentile metric two or more VMs report:
    /// the percentile of their merged histograms, over every VM's samples
    /// (docs/metrics.md, Several VMs).
    fn merged_percentiles(&self, metrics: &mut Metrics) {
        let mut families: Vec<crate::guest::app::LatencyFamily<'_>> = Vec::new();
        for g in &self.guests {
            g.latencies(&mut families);
        }
        for link in &self.peers {
            link.peer.latencies(&mut families);
        }
        // Families by their first metric's name, in order of appearance.
        let mut done: Vec<&str> = Vec::new();
        for (i, f) in families.iter().enumerate() {
            let Some((key, _, _)) = f.metrics.first() else {
                continue;
            };
            if done.contains(&key.as_str()) {
                continue;
            }
            done.push(key);
            let same: Vec<_> = families[i..]
                .iter()
                .filter(|g| g.metrics.first().is_some_and(|(k, _, _)| k == key))
                .collect();
            if same.len() < 2 {
                continue;
            }
            let mut merged = crate::engine::LatencyHistogram::new();
            for g in &same {
                merged.merge(g.hist);
            }
            f.insert_merged(metrics, &merged, "all.");
        }
    }

    pub(super) fn snapshot(&self) -> crate::report::Snapshot<'_> {
        let mut metrics = Metrics::new();
        let dur = (self.end - self.measure_start) as f64 / SEC as f64;
        // VM 0's metrics by their plain names, VM i's prefixed `vm<i>.`.
        for vm in 0..self.guests.len() {
            let mut m = Metrics::new();
            self.vm_metrics(vm, &mut m, dur);
            let prefix = crate::report::vm_prefix(vm);
            for (k, v) in m {
                metrics.insert(format!("{prefix}{k}"), v);
            }
        }
        for link in &self.peers {
            if link.vm == 0 {
                link.peer.metrics(&mut metrics);
            } else {
                let mut m = Metrics::new();
                link.peer.metrics(&mut m);
                // A VM's several peer processes (netperf instances) sum.
                for (k, v) in m {
                    *metrics.entry(format!("vm{}.{k}", link.vm)).or_insert(0.0) += v;
                }
            }
        }
        if self.guests.len() >= 2 {
            self.merged_percentiles(&mut metrics);
        }
        self.canal_metrics(&mut metrics, dur);
        self.vsock_metrics(&mut metrics, dur);
        // The VMs' netperf receivers together, over the measured interval:
        // each instance's own throughput spans its first to last byte, so
        // with VMs that take turns on a shared core their sum overstates
        // what the host carried (issue 21 item 6's aggregate).
        let stream_bytes: Vec<f64> = (0..self.guests.len())
            .filter_map(|vm| {
                let prefix = crate::report::vm_prefix(vm);
                metrics.get(&format!("{prefix}netperf.bytes")).copied()
            })
            .collect();
        if !stream_bytes.is_empty() && dur > 0.0 {
            let total: f64 = stream_bytes.iter().sum();
            metrics.insert("netperf.aggregate_gbps".into(), total * 8.0 / dur / 1e9);
        }
        self.scheme.metrics(&mut metrics);
        if self.scenario.machine.smt {
            // The share of the guests' work (planned segments, measured
            // interval) that ran beside a busy Hyper-Threading sibling.
            let [all, shared] = self.smt_work;
            metrics.insert(
                "host.smt_shared_pct".into(),
                100.0 * shared as f64 / (all as f64).max(1.0),
            );
        }
        if let Some(a) = &self.el2 {
            a.metrics(&mut metrics, dur, &self.hv.vms);
        }
        if let Some(h) = &self.hs {
            h.metrics(&mut metrics, dur);
        }
        if let Some(e) = &self.event_exits {
            e.metrics(&mut metrics);
        }
        if self.sched.is_some() || !self.scenario.preemptions.is_empty() {
            self.sched_metrics(&mut metrics, self.end, dur);
            let w = &self.checker.waited_schedule_in;
            metrics.insert("irq.waited_schedule_in".into(), w.count() as f64);
            if w.count() > 0 {
                metrics.insert(
                    "irq.waited_schedule_in_mean_us".into(),
                    crate::engine::as_us(w.mean()),
                );
                metrics.insert(
                    "irq.waited_schedule_in_p99_us".into(),
                    crate::engine::as_us(w.percentile(99.0)),
                );
            }
            let d = &self.checker.descheduled_delay;
            metrics.insert("irq.descheduled".into(), d.count() as f64);
            if d.count() > 0 {
                metrics.insert(
                    "irq.descheduled_delay_mean_us".into(),
                    crate::engine::as_us(d.mean()),
                );
                metrics.insert(
                    "irq.descheduled_delay_p99_us".into(),
                    crate::engine::as_us(d.percentile(99.0)),
                );
                metrics.insert(
                    "irq.descheduled_delay_max_us".into(),
                    crate::engine::as_us(d.max()),
                );
            }
        }
        for b in &self.blk {
            b.metrics(&mut metrics);
        }
        if let Some(k) = &self.kvmtool {
            self.kvmtool_metrics(k, &mut metrics, dur);
        }
        if let Some(pv) = &self.pv {
            self.vhost_metrics(pv, &mut metrics, dur);
        }
        for (vm, r) in self.hv.redirect.iter().enumerate() {
            if let Some(r) = r {
                let p = crate::report::vm_prefix(vm);
                metrics.insert(format!("{p}es2.redirected"), r.redirected as f64);
                metrics.insert(format!("{p}es2.to_offline"), r.to_offline as f64);
            }
        }
        crate::report::Snapshot {
            scenario: &self.scenario,
            calibration_changes: &self.calibration_changes,
            scheme: match &self.el2 {
                Some(a) => a.scheme.name(),
                None => self.scheme.name(),
            },
            duration: self.end - self.measure_start,
            vms: &self.hv.vms,
            metrics,
            checker: &self.checker,
            timer_exits: &self.timer_exits,
            exits: self.arch_exit_tables(),
            msi_faults: self.msi_faults,
        }
    }
}
