//! The guest OS model: one Linux-3.6-like kernel per vCPU (or per core on bare
//! metal). It runs interrupt handlers through its IDT, acknowledges them with
//! end-of-interrupt writes, programs its clockevent, receives packets with NAPI
//! through the ixgbevf-like VF driver, keeps hrtimers, and schedules tasks by
//! priority. Every privileged action is an arch-neutral [`KernelOp`] that the
//! architecture turns into an instruction; whether it exits is not the
//! guest's business.

pub mod app;
pub mod blk;
pub mod did_module;
mod fair;
pub mod itr;
pub mod libcanal;
pub mod net;
pub mod rps;
pub mod tcp;
mod testmod;
pub mod vsock;

use crate::engine::{Time, VcpuMask, NS};
use crate::hw::wire::Frame as WireFrame;
use crate::hw::x86::lapic::ApicBitmap;
use app::{App, Datagram, Metrics, Sys, TaskStep};
use itr::{DynamicItr, ItrParams};
use net::{Devices, NetCounters, TcpSock, VirtioNetGuest};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// How the guest runs its periodic scheduler tick.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TickMode {
    /// A tick every 1/HZ, always.
    Periodic,
    /// NO_HZ idle: the tick stops while the CPU idles (each stop and restart
    /// reprograms the clockevent).
    NohzIdle,
    /// No tick at all.
    Off,
}

/// Costs of guest kernel paths (from the calibration file).
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct GuestCosts {
    pub irq_entry: Time,
    pub irq_exit: Time,
    pub hrtimer_interrupt: Time,
    pub tick_handler: Time,
    pub vf_irq_handler: Time,
    pub napi_poll_base: Time,
    pub rx_per_packet: Time,
    /// A received frame GRO merges into a held packet: the driver's clean
    /// of its descriptor plus `skb_gro_receive`, in place of
    /// `rx_per_packet` (the merged packet pays IP and TCP once).
    pub gro_merge: Time,
    pub itr_update: Time,
    pub context_switch: Time,
    pub syscall: Time,
    pub tcp_rx_segment: Time,
    pub tcp_tx_segment: Time,
    pub udp_tx_datagram: Time,
    pub virtio_xmit: Time,
    pub vf_xmit: Time,
    /// Direct I/O down to the plug list, per request.
    pub blk_submit: Time,
    /// CFQ's insert at unplug, per request.
    pub blk_elv_insert: Time,
    /// CFQ's dispatch and virtio-blk's `do_req`, per request.
    pub blk_dispatch: Time,
    pub blk_complete: Time,
    /// icmp_rcv → icmp_echo → icmp_reply → ip_push_pending_frames, per
    /// echo request answered (ping).
    pub icmp_echo: Time,
    /// The part of `rx_per_packet` above the driver (`__netif_receive_skb`
    /// up to the socket): with RPS it runs on the backlog's CPU.
    pub rx_protocol: Time,
    /// RPS per packet on the polling CPU: `get_rps_cpu` and
    /// `enqueue_to_backlog`.
    pub rps_enqueue: Time,
    /// The CALL_FUNCTION_SINGLE IPI's handler body.
    pub call_function_ipi: Time,
    /// A SYN on a listening socket past the segment's receive
    /// (`tcp_v4_conn_request`).
    pub tcp_conn_request: Time,
    /// The handshake's final ACK past the segment's receive
    /// (`tcp_v4_syn_recv_sock`, the child socket queued for accept).
    pub tcp_syn_recv_sock: Time,
}

/// The guest's idle loop.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum IdleMode {
    /// `idle=poll`: spin until an interrupt arrives (no exit, the vCPU
    /// keeps its core).
    #[default]
    Poll,
    /// `default_idle`: `sti; hlt`. With HLT exiting the vCPU exits and its
    /// thread sleeps until an interrupt for it is pending.
    Halt,
}

/// How the guest drives its LAPIC.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ApicMode {
    /// x2APIC: registers are MSRs (WRMSR 0x80B is the EOI).
    #[default]
    X2apic,
    /// xAPIC: registers are MMIO in the APIC page (a store to offset 0xB0
    /// is the EOI), as ES2's guests ran.
    Xapic,
}

/// Static configuration of one guest kernel.
#[derive(Clone, Debug)]
pub struct GuestConfig {
    /// LOCAL_TIMER_VECTOR of the guest.
    pub timer_vector: u8,
    /// The DID authors' guest module is loaded (`did_module`,
    /// did-implementation.md §3): each CPU enables the direct timer by
    /// hypercalls at boot, filters early timer interrupts and posts its
    /// IPIs.
    pub did_module: bool,
    /// Vector the guest programmed into its VF's MSI-X entry.
    pub vf_vector: u8,
    /// The VF this guest drives, if any.
    pub vf: Option<u16>,
    /// Queue pairs of that function (1 but for a native kernel's RSS):
    /// queue q interrupts on `vf_vector + q`, has its own NAPI and ITR,
    /// and a CPU sends on queue `cpu mod vf_queues`.
    pub vf_queues: u8,
    /// Its interrupt is a level-sensitive wire (a NIC on an SPI), not an
    /// MSI-X message the device masks itself (VTEIAM): the handler masks
    /// the interrupt at the device before the EOI, or the still-high line
    /// would signal again at once (Linux's handle_fasteoi_irq runs the
    /// whole handler before irq_eoi).
    pub vf_wired_irq: bool,
    /// The virtio-net device this guest drives, if any.
    pub virtio_net: Option<VirtioNetGuest>,
    /// The virtio-blk device this guest drives, if any.
    pub virtio_blk: Option<blk::VirtioBlkGuest>,
    /// A wait-queue driver (vCanal's helper driver), if loaded.
    pub wait_driver: Option<WaitQueueDriver>,
    /// The receive queue's `rps_cpus` (empty: RPS off).
    pub rps_cpus: Vec<usize>,
    /// CONFIG_HZ.
    pub hz: u32,
    /// Tick behaviour.
    pub tick: TickMode,
    /// Handlers run with interrupts enabled and EOI at their end (a kernel
    /// that nests interrupts). Linux 3.6 does neither: EOI first, IF=0.
    pub irq_nesting: bool,
    /// What the idle loop does.
    pub idle: IdleMode,
    /// The clockevent device.
    pub clockevent: Clockevent,
    /// Socket receive buffer, in datagrams.
    pub rcvbuf_packets: usize,
    /// NAPI weight.
    pub napi_weight: u32,
    /// net_rx_action's packet budget per softirq run before it defers to
    /// ksoftirqd.
    pub netdev_budget: u32,
    /// RX buffers returned to the NIC in batches of this many.
    pub refill_batch: u16,
    /// GRO on the receive path (`napi_gro_receive`; on by default in
    /// Linux, NETIF_F_GRO).
    pub gro: bool,
    /// Dynamic ITR parameters.
    pub itr: ItrParams,
    /// Path costs.
    pub costs: GuestCosts,
}

/// A character-device driver whose tasks sleep on its wait queue until its
/// interrupt wakes them, and which may announce shared pages to the
/// hypervisor at boot with one hypercall: vCanal's helper driver
/// (vcanal.md §2.1: "allocates channel pages at boot and announces them
/// (one exit on KVM)"; §2.5: "registers a dedicated interrupt handler ...
/// parks the process on a wait queue").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitQueueDriver {
    /// The vector of its interrupt.
    pub vector: u8,
    /// Its handler's work past the IRQ entry (the wake-up).
    pub handler: Time,
    /// The hypercall (number, argument) CPU 0 makes once at boot.
    pub announce: Option<(u32, u64)>,
    /// Its doorbell: the I/O port a `DriverKick` writes, if it has one.
    pub doorbell: Option<u16>,
}

/// The kernel's clockevent device as its driver sees it (Linux's
/// `clock_event_device`): the tick a programmed delta counts in, the
/// shortest delta it accepts, and how many register writes its boot-time
/// setup takes. The architecture provides it (x86: the LAPIC timer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clockevent {
    /// One tick of the device.
    pub tick: Time,
    /// `min_delta_ticks`: shorter deltas are rounded up to this.
    pub min_delta_ticks: u32,
    /// Register writes of the one-shot setup at boot.
    pub init_steps: u8,
}

/// An operation the kernel asks of its platform: its interrupt controller,
/// its clockevent, a device register, or idle. It names what the kernel
/// wants, not an instruction: the architecture turns it into the
/// instruction it is there (x86: `world::vmx` lowers it to WRMSR, OUT, HLT
/// or an MMIO store), which the hardware executes and the hypervisor's
/// configuration makes trap or not. Whether it exits is not the guest's
/// business.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelOp {
    /// End of interrupt for the handler of `vector` (x86: the x2APIC EOI
    /// register; ARM: ICC_EOIR1_EL1).
    EndOfInterrupt {
        /// The vector the guest believes it completes.
        vector: u8,
    },
    /// Programs the clockevent to fire in `ticks` of its tick (x86: TMICT;
    /// ARM: CNTV_TVAL/CVAL). `deadline` is the expiry the guest expects.
    ProgramClockevent {
        /// Delta, in device ticks.
        ticks: u32,
        /// Expected expiry.
        deadline: Option<Time>,
        /// Timer vector (for the checker).
        vector: u8,
    },
    /// Step `step` of the clockevent's boot-time one-shot setup on
    /// `vector` (x86: the LVT timer entry, then the divider).
    ClockeventInit {
        /// Which register write of the setup.
        step: u8,
        /// The timer's vector.
        vector: u8,
    },
    /// An IPI with `vector` to this VM's CPU `cpu` (x86: the x2APIC ICR;
    /// ARM: ICC_SGI1R_EL1).
    SendIpi {
        /// Target CPU of this kernel.
        cpu: u32,
        /// Vector.
        vector: u8,
    },
    /// A fixed IPI with `vector` to the CPU itself through the interrupt
    /// controller's self-IPI shorthand (x86: the x2APIC SELF IPI register,
    /// 83FH).
    SelfIpi {
        /// Vector.
        vector: u8,
    },
    /// Sets the CPU's task priority (x86: the x2APIC TPR, 808H; its
    /// class masks vectors of that class and below).
    TaskPriority {
        /// The TPR value.
        value: u8,
    },
    /// A virtqueue notify: a write to the device's notify register, which
    /// the hypervisor emulates (x86: OUT to an I/O port).
    QueueNotify {
        /// Port.
        port: u16,
        /// Value written (the queue index for QUEUE_NOTIFY).
        value: u32,
    },
    /// A store to a register of the VF's BAR (mapped into the guest).
    VfWrite {
        /// VF.
        vf: u16,
        /// Register.
        reg: VfReg,
    },
    /// Idle until an interrupt, interrupts on (x86: `sti; hlt`; ARM: WFI).
    Idle,
    /// A hypercall `nr` with argument `arg` (x86: VMCALL, RAX/RBX; ARM:
    /// HVC), as a guest module issues it.
    Hypercall {
        /// Hypercall number.
        nr: u32,
        /// Argument.
        arg: u64,
    },
    /// Sets bit `vector` in the posted-interrupt request bitmap of CPU
    /// `cpu`'s descriptor page, which the hypervisor mapped into guest
    /// memory (Directvisor's module, did-implementation.md §3). A memory
    /// store.
    PirSet {
        /// The CPU whose descriptor page.
        cpu: u32,
        /// Vector.
        vector: u8,
    },
    /// A posted IPI: set `vector` in CPU `cpu`'s descriptor page, then send
    /// the host's posted-interrupt notification vector to that CPU's APIC
    /// ID as the guest read it (Directvisor's `set_apic_ipi` replacement of
    /// `apic->send_IPI`, did-implementation.md §3 "IPI").
    PostedIpi {
        /// Target CPU of this kernel.
        cpu: u32,
        /// The vector that travels in the PIR.
        vector: u8,
    },
}

/// VF registers the driver writes on its hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VfReg {
    /// VTEITR(vector) := value.
    Eitr(u8, u32),
    /// VTEIMS := bits (re-enable after napi_complete).
    Eims(u32),
    /// VTEIMC := bits (mask at the device: a wired interrupt's handler
    /// does it before it returns, e1000_intr's IMC write, stmmac's
    /// stmmac_disable_dma_irq).
    Eimc(u32),
    /// VFTDT(q): TX queue q's tail doorbell after writing descriptors.
    Tdt(u8),
}

/// The guest's next action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run for this long.
    Compute(Time),
    /// Ask the platform for an operation, then ask again.
    Op(KernelOp),
    /// The handler of this vector returned (iret); ask again.
    Returned(u8),
    /// Nothing to run: the idle loop spins (idle=poll) until interrupted.
    Spin,
    /// RFLAGS.IF just went from 0 to 1 (sti, iret, popf): the hardware
    /// must look at pending interrupts before the guest goes on; ask again.
    InterruptsEnabled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskState {
    Runnable,
    Blocked,
    Sleeping,
    Exited,
}

struct Task {
    app: Box<dyn App>,
    prio: i32,
    state: TaskState,
    compute: Time,
    socket: Option<usize>,
    tcp: Option<usize>,
    /// Serves many connections (epoll): sees every socket in `Sys::conns`.
    multi_tcp: bool,
    /// Its sockets that received since its last step (the epoll ready
    /// list).
    ready: Vec<usize>,
    /// The CPU it is bound to.
    cpu: usize,
    /// Asleep on the wait-queue driver's queue.
    on_driver: bool,
    /// CPU time it has asked for (the fair share's virtual runtime).
    vruntime: Time,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HrKind {
    Tick,
    Wake(usize),
    /// The earliest TCP timer on the jiffy wheel.
    TcpWheel,
    Guard,
    /// The hrtimer latency module's timer (`testmod`).
    LatencyProbe,
    /// The IPI latency module's sending timer (`testmod`).
    IpiProbe,
}

#[derive(Clone, Copy, Debug)]
enum FrameKind {
    Boot,
    /// The DID module's per-CPU enable (`did_module::enable_step`).
    DidModule,
    /// The wait-queue driver's boot-time announcement (one hypercall).
    DriverAnnounce,
    Irq {
        vector: u8,
    },
    Softirq {
        round: u32,
        /// The VF queue this NAPI polls.
        queue: u8,
    },
    VirtioPoll {
        round: u32,
    },
    NetTx,
    /// `process_backlog` (RPS): NET_RX for the packets steered here.
    Backlog {
        round: u32,
    },
    BlkSubmit,
    Switch {
        to: Option<usize>,
    },
    /// `clock_nanosleep`, or with `wait` an `epoll_wait` that data on the
    /// task's socket ends early.
    Nanosleep {
        task: usize,
        until: Time,
        wait: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    kind: FrameKind,
    stage: u8,
    compute: Time,
    saved_if: bool,
}

/// Counters of one guest kernel.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct GuestCounters {
    pub irqs: u64,
    pub timer_irqs: u64,
    pub vf_irqs: u64,
    pub rx_packets: u64,
    pub socket_drops: u64,
    pub tmict_writes: u64,
    pub context_switches: u64,
    pub tasks_exited: u64,
    pub ipis_sent: u64,
    pub resched_irqs: u64,
}

/// The per-CPU part of the kernel: what Linux keeps per CPU (the run
/// queue's current task and resched flag, the clockevent and its
/// hrtimers, RFLAGS.IF and the interrupt stack, pending softirqs).
struct Cpu {
    if_flag: bool,
    frames: Vec<Frame>,
    in_service: ApicBitmap,
    if_rose: bool,
    /// NAPI of the VF's queues scheduled on this CPU (bit q: it took
    /// queue q's interrupt).
    net_rx: u32,
    in_softirq: bool,
    current: Option<usize>,
    need_resched: bool,
    hrtimers: Vec<(Time, HrKind)>,
    programmed: Option<Time>,
    tick_on: bool,
    /// NAPI of virtio-net scheduled on this CPU.
    napi_virtio: bool,
    softirq_done: u32,
    ksoftirqd: bool,
    task_stepped: bool,
    /// Other CPUs this one must send a reschedule IPI (`smp_send_reschedule`).
    ipi_pending: VcpuMask,
    /// Other CPUs whose polling idle loop will see a need_resched set from
    /// here (TIF_POLLING_NRFLAG: no IPI).
    poke_pending: VcpuMask,
    /// GRO's held packets (`napi->gro_list`) of the NAPI running here,
    /// oldest first; flushed at `napi_complete`.
    gro: Vec<crate::hw::wire::Frame>,
    /// RPS: this CPU's backlog is on its poll list (NET_RX runs it).
    backlog_poll: bool,
    /// RPS: CPUs whose backlog this NET_RX run scheduled (`rps_ipi_list`).
    rps_ipi_list: VcpuMask,
    /// CPUs to send a CALL_FUNCTION_SINGLE IPI now.
    call_ipi_pending: VcpuMask,
    /// `ipi_pending` or `call_ipi_pending` may be non-empty: one flag to
    /// test on every step instead of two 256-bit masks.
    ipis_queued: bool,
    /// The DID module's direct timer and posted IPIs are on here.
    dtid: bool,
    /// When the EOI of the interrupt being handled here was issued.
    eoi_at: Time,
}

impl Cpu {
    fn new() -> Self {
        Cpu {
            if_flag: false,
            frames: {
                let mut v = Vec::with_capacity(32);
                v.push(Frame {
                    kind: FrameKind::Boot,
                    stage: 0,
                    compute: 0,
                    saved_if: true,
                });
                v
            },
            in_service: ApicBitmap::default(),
            if_rose: false,
            net_rx: 0,
            in_softirq: false,
            current: None,
            need_resched: false,
            hrtimers: Vec::with_capacity(16),
            programmed: None,
            tick_on: false,
            napi_virtio: false,
            softirq_done: 0,
            ksoftirqd: false,
            task_stepped: false,
            ipi_pending: VcpuMask::EMPTY,
            poke_pending: VcpuMask::EMPTY,
            gro: Vec::with_capacity(net::MAX_GRO_SKBS),
            backlog_poll: false,
            rps_ipi_list: VcpuMask::EMPTY,
            call_ipi_pending: VcpuMask::EMPTY,
            ipis_queued: false,
            dtid: false,
            eoi_at: 0,
        }
    }
}

/// Linux's RESCHEDULE_VECTOR: the IPI `smp_send_reschedule` sends.
pub const RESCHEDULE_VECTOR: u8 = 0xfd;

/// One guest kernel: one per VM, with per-CPU state for each of its vCPUs
/// (one per core on bare metal). Calls name the CPU they run on; the
/// kernel indexes that CPU's state in place.
pub struct Kernel {
    cfg: GuestConfig,
    /// The CPU the current call runs on (its state is `cpus[on]`).
    on: usize,
    /// Every CPU's state.
    cpus: Vec<Cpu>,
    tasks: Vec<Task>,
    sockets: Vec<VecDeque<Datagram>>,
    /// Datagrams sent on UDP sockets, waiting for the transmit path.
    udp_tx: VecDeque<Datagram>,
    /// Per VF queue: its q_vector's adaptive ITR.
    itr: Vec<DynamicItr>,
    /// Per VF queue: descriptors cleaned and not yet returned.
    cleaned_unrefilled: Vec<u16>,
    tcp_socks: Vec<TcpSock>,
    /// Flow → its TCP socket.
    flow_sock: Vec<Option<usize>>,
    /// TCP timers by expiry tick: (tick, socket, its timer generation).
    tcp_wheel: BinaryHeap<Reverse<(Time, usize, u64)>>,
    /// The tick of the TcpWheel hrtimer, if armed.
    tcp_wheel_armed: Option<Time>,
    /// The CPU whose hrtimer list holds the TcpWheel hrtimer (the one
    /// that armed it last), if one does.
    tcp_wheel_cpu: Option<usize>,
    /// Sockets a many-connection task acted on in its last step.
    touched: Vec<usize>,
    touched_seen: Vec<bool>,
    /// Sockets that may have output (the transmit path polls only these).
    tx_dirty: Vec<usize>,
    tx_dirty_seen: Vec<bool>,
    blk: blk::BlkQueue,
    rq: blk::RequestQueue,
    blk_task: Option<usize>,
    tx_pending: bool,
    tx_backlog: VecDeque<WireFrame>,
    tx_stopped: bool,
    /// The CPU running the transmit path, and how deeply (an interrupt
    /// on that CPU may run it again inside).
    tx_owner: Option<usize>,
    tx_depth: u32,
    tx_rr: usize,
    /// UDP sockets bound to a flow: (flow, socket).
    udp_binds: Vec<(u16, usize)>,
    /// Tasks blocked in sendto() on a full UDP send buffer.
    udp_tx_waiters: Vec<usize>,
    /// Equal-priority tasks share a CPU fairly (see `fair`).
    fair: Option<fair::FairShare>,
    /// Receive packet steering, when `rps_cpus` is set.
    rps: Option<rps::Rps>,
    rps_counters: rps::RpsCounters,
    net: NetCounters,
    /// The hrtimer latency test module, if loaded.
    hrtimer_latency: Option<testmod::HrtimerLatency>,
    /// The IPI latency test module, if loaded.
    ipi_latency: Option<testmod::IpiLatency>,
    /// Counters.
    pub counters: GuestCounters,
    /// Seeded variance of the per-operation costs it charges.
    variance: crate::engine::rng::CostVariance,
}

impl Kernel {
    /// A kernel that boots (programs its LAPIC timer) on its first step.
    pub fn new(cfg: GuestConfig) -> Self {
        Self::smp(cfg, 1)
    }

    /// A kernel of `cpus` CPUs (at most a [`VcpuMask`]'s), each booting on its first step.
    pub fn smp(cfg: GuestConfig, cpus: usize) -> Self {
        let queues = usize::from(cfg.vf_queues.max(1));
        let itr = (0..queues).map(|_| DynamicItr::new(&cfg.itr)).collect();
        let cpus = cpus.clamp(1, crate::engine::VCPUMASK_BITS);
        let rps = rps::Rps::new(&cfg.rps_cpus, cpus);
        Kernel {
            on: 0,
            cpus: (0..cpus).map(|_| Cpu::new()).collect(),
            tasks: Vec::new(),
            sockets: Vec::new(),
            udp_tx: VecDeque::with_capacity(app::UDP_SNDBUF_DATAGRAMS),
            itr,
            cleaned_unrefilled: vec![0; queues],
            tcp_socks: Vec::new(),
            flow_sock: Vec::new(),
            tcp_wheel: BinaryHeap::with_capacity(64),
            tcp_wheel_armed: None,
            tcp_wheel_cpu: None,
            touched: Vec::new(),
            touched_seen: Vec::new(),
            tx_dirty: Vec::new(),
            tx_dirty_seen: Vec::new(),
            blk: blk::BlkQueue::default(),
            rq: blk::RequestQueue::default(),
            blk_task: None,
            tx_pending: false,
            tx_backlog: VecDeque::with_capacity(256),
            tx_stopped: false,
            tx_owner: None,
            tx_depth: 0,
            tx_rr: 0,
            udp_binds: Vec::new(),
            udp_tx_waiters: Vec::new(),
            fair: None,
            rps,
            rps_counters: rps::RpsCounters::default(),
            net: NetCounters::default(),
            hrtimer_latency: None,
            ipi_latency: None,
            counters: GuestCounters::default(),
            variance: crate::engine::rng::CostVariance::off(),
            cfg,
        }
    }

    /// Gives its per-operation costs (kernel paths, and the compute steps
    /// of programs whose [`App::varies`]) a seeded variance.
    pub fn set_cost_variance(&mut self, v: crate::engine::rng::CostVariance) {
        self.variance = v;
    }

    /// One charge of the per-operation cost `c` (its calibrated mean).
    #[inline]
    fn vary(&mut self, c: Time) -> Time {
        self.variance.vary(c)
    }

    /// The top frame's next compute: one charge of `c`.
    pub(crate) fn set_compute(&mut self, top: usize, c: Time) {
        let c = self.vary(c);
        self.cpus[self.on].frames[top].compute = c;
    }

    /// Number of CPUs.
    pub fn cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Makes CPU `c` the one calls run on (no state moves: it is indexed
    /// in place).
    #[inline]
    fn on_cpu(&mut self, c: usize) {
        debug_assert!(c < self.cpus.len());
        self.on = c;
    }

    /// CPU `c`'s state, read only.
    fn cpu_ref(&self, c: usize) -> &Cpu {
        &self.cpus[c]
    }

    /// CPUs other than the caller's that must get a reschedule IPI or
    /// whose polling idle loop was poked, since the last call.
    pub fn take_pokes(&mut self, c: usize) -> VcpuMask {
        self.on_cpu(c);
        std::mem::take(&mut self.cpus[self.on].poke_pending)
    }

    /// Gives task `t` the block queue of the virtio-blk device.
    pub fn attach_blk(&mut self, t: usize) {
        self.blk_task = Some(t);
    }

    /// The configuration.
    pub fn config(&self) -> &GuestConfig {
        &self.cfg
    }

    /// Adds a task. `prio`: higher runs first (RT above normal above idle
    /// class). `socket`: give it a UDP socket that receives the VF's traffic.
    pub fn spawn(&mut self, app: Box<dyn App>, prio: i32, socket: bool) -> usize {
        self.spawn_on(0, app, prio, socket)
    }

    /// Adds a task bound to CPU `cpu` (`sched_setaffinity` to one CPU).
    pub fn spawn_on(&mut self, cpu: usize, app: Box<dyn App>, prio: i32, socket: bool) -> usize {
        let cpu = cpu.min(self.cpus.len() - 1);
        let socket = socket.then(|| {
            self.sockets
                .push(VecDeque::with_capacity(self.cfg.rcvbuf_packets));
            self.sockets.len() - 1
        });
        self.tasks.push(Task {
            app,
            prio,
            state: TaskState::Runnable,
            compute: 0,
            socket,
            tcp: None,
            multi_tcp: false,
            ready: Vec::new(),
            cpu,
            vruntime: 0,
            on_driver: false,
        });
        self.cpus[cpu].need_resched = true;
        self.tasks.len() - 1
    }

    /// RFLAGS.IF.
    pub fn interrupts_enabled(&self, cpu: usize) -> bool {
        self.cpu_ref(cpu).if_flag
    }

    /// Vectors CPU `cpu` has taken and not yet EOI'd.
    pub fn in_service(&self, cpu: usize) -> ApicBitmap {
        self.cpu_ref(cpu).in_service
    }

    /// Task metrics of every task.
    pub fn metrics(&self, out: &mut Metrics) {
        for t in &self.tasks {
            t.app.metrics(out);
        }
        self.net_metrics(out);
        self.testmod_metrics(out);
    }

    /// The latency distributions behind the tasks' and test modules'
    /// percentile metrics.
    pub fn latencies<'a>(&'a self, out: &mut Vec<app::LatencyFamily<'a>>) {
        for t in &self.tasks {
            t.app.latencies(out);
        }
        self.testmod_latencies(out);
    }

    /// Start of the measured interval.
    pub fn reset_metrics(&mut self) {
        for t in &mut self.tasks {
            t.app.reset_metrics();
        }
        self.counters = GuestCounters {
            tasks_exited: self.counters.tasks_exited,
            ..Default::default()
        };
        self.net = NetCounters::default();
        self.rps_counters = rps::RpsCounters::default();
        self.testmod_reset();
    }

    /// The interrupt gate for `vector` is taken: IF is cleared and the
    /// handler frame starts (the caller has already moved IRR to ISR).
    pub fn take_interrupt(&mut self, cpu: usize, vector: u8) {
        self.on_cpu(cpu);
        self.counters.irqs += 1;
        self.cpus[self.on].in_service.set(vector);
        let entry = self.vary(self.cfg.costs.irq_entry);
        let cpu = &mut self.cpus[self.on];
        cpu.frames.push(Frame {
            kind: FrameKind::Irq { vector },
            stage: 0,
            compute: entry,
            saved_if: cpu.if_flag,
        });
        self.cpus[self.on].if_flag = false;
    }

    /// The last `Compute` ran to completion.
    pub fn compute_done(&mut self, cpu: usize) {
        self.on_cpu(cpu);
        match self.cpus[self.on].frames.last_mut() {
            Some(f) => f.compute = 0,
            None => {
                if let Some(t) = self.cpus[self.on].current {
                    self.tasks[t].compute = 0;
                }
            }
        }
    }

    /// The last `Compute` was preempted after `elapsed`.
    pub fn charge(&mut self, cpu: usize, elapsed: Time) {
        self.on_cpu(cpu);
        let c = match self.cpus[self.on].frames.last_mut() {
            Some(f) => &mut f.compute,
            None => match self.cpus[self.on].current {
                Some(t) => &mut self.tasks[t].compute,
                None => return,
            },
        };
        *c = c.saturating_sub(elapsed);
    }

    fn wake(&mut self, t: usize) {
        if matches!(
            self.tasks[t].state,
            TaskState::Blocked | TaskState::Sleeping
        ) {
            self.tasks[t].state = TaskState::Runnable;
            self.fair_wake(t);
            let c = self.tasks[t].cpu;
            let cpu = &mut self.cpus[c];
            let cur = cpu.current.map(|c| self.tasks[c].prio);
            if cur.is_none_or(|p| self.tasks[t].prio > p) || cpu.current == Some(t) {
                cpu.need_resched = true;
                if c != self.on {
                    // try_to_wake_up on a remote CPU: resched_task sends
                    // it a reschedule IPI unless its idle loop polls
                    // need_resched (TIF_POLLING_NRFLAG).
                    if cpu.current.is_none() && self.cfg.idle == IdleMode::Poll {
                        self.cpus[self.on].poke_pending.insert(c);
                    } else {
                        self.cpus[self.on].ipi_pending.insert(c);
                        self.cpus[self.on].ipis_queued = true;
                    }
                }
            }
        }
    }

    fn pick(&mut self) -> Option<usize> {
        if self.fair.is_some() {
            return self.fair_pick();
        }
        let mut best: Option<usize> = None;
        for (i, t) in self.tasks.iter().enumerate() {
            if t.cpu == self.on
                && t.state == TaskState::Runnable
                && best.is_none_or(|b| t.prio > self.tasks[b].prio)
            {
                best = Some(i);
            }
        }
        best
    }

    fn tick_period(&self) -> Time {
        crate::engine::SEC / self.cfg.hz.max(1) as Time
    }

    fn start_tick(&mut self, now: Time) {
        if self.cpus[self.on].tick_on || self.cfg.tick == TickMode::Off {
            return;
        }
        self.cpus[self.on].tick_on = true;
        let p = self.tick_period();
        self.cpus[self.on]
            .hrtimers
            .push(((now / p + 1) * p, HrKind::Tick));
    }

    fn stop_tick(&mut self) {
        self.cpus[self.on].tick_on = false;
        self.cpus[self.on].hrtimers.retain(|h| h.1 != HrKind::Tick);
    }

    /// Reprograms the clockevent if the earliest hrtimer changed.
    fn reprogram(&mut self, now: Time) -> Option<KernelOp> {
        let next = self.cpus[self.on].hrtimers.iter().map(|h| h.0).min();
        if next == self.cpus[self.on].programmed {
            return None;
        }
        self.cpus[self.on].programmed = next;
        // With no timer left Linux does not touch the device
        // (hrtimer_force_reprogram skips KTIME_MAX): an armed one-shot may
        // still fire and finds nothing expired.
        let t = next?;
        self.counters.tmict_writes += 1;
        let ce = self.cfg.clockevent;
        let p = ce.tick.max(1);
        let ticks = (t.saturating_sub(now).div_ceil(p))
            .clamp(u64::from(ce.min_delta_ticks), u32::MAX as u64) as u32;
        Some(KernelOp::ProgramClockevent {
            ticks,
            deadline: Some(now + ticks as Time * p),
            vector: self.cfg.timer_vector,
        })
    }

    /// Runs expired hrtimers; returns how many ticks ran.
    fn expire_hrtimers(&mut self, now: Time) -> u32 {
        let mut ticks = 0;
        let mut i = 0;
        while i < self.cpus[self.on].hrtimers.len() {
            if self.cpus[self.on].hrtimers[i].0 <= now {
                let (t, k) = self.cpus[self.on].hrtimers.swap_remove(i);
                match k {
                    HrKind::Tick => {
                        ticks += 1;
                        let p = self.tick_period();
                        let mut n = t + p;
                        while n <= now {
                            n += p;
                        }
                        self.cpus[self.on].hrtimers.push((n, HrKind::Tick));
                    }
                    HrKind::Wake(task) => self.wake(task),
                    HrKind::TcpWheel => self.tcp_wheel_run(now),
                    // The guard expired before the request completed.
                    HrKind::Guard => {}
                    HrKind::LatencyProbe | HrKind::IpiProbe => self.probe_expired(k, t, now),
                }
            } else {
                i += 1;
            }
        }
        ticks
    }

    /// Delivers a datagram into the first socket (the VF's UDP port).
    fn socket_enqueue(&mut self, d: Datagram) {
        let Some(s) = self.sockets.first_mut() else {
            self.counters.socket_drops += 1;
            return;
        };
        if s.len() >= self.cfg.rcvbuf_packets {
            self.counters.socket_drops += 1;
            return;
        }
        s.push_back(d);
        if let Some(t) = self.tasks.iter().position(|t| t.socket == Some(0)) {
            self.wake(t);
        }
    }

    /// Sets RFLAGS.IF, noting a rising edge for the hardware.
    fn set_if(&mut self, on: bool) {
        if on && !self.cpus[self.on].if_flag {
            self.cpus[self.on].if_rose = true;
        }
        self.cpus[self.on].if_flag = on;
    }

    fn push(&mut self, kind: FrameKind, compute: Time, if_flag: bool) {
        let compute = self.vary(compute);
        let cpu = &mut self.cpus[self.on];
        cpu.frames.push(Frame {
            kind,
            stage: 0,
            compute,
            saved_if: cpu.if_flag,
        });
        self.set_if(if_flag);
    }

    fn pop(&mut self) {
        if let Some(f) = self.cpus[self.on].frames.pop() {
            self.set_if(f.saved_if);
        }
    }

    /// The guest's next action at `now`. `dev` is the device memory its
    /// drivers see (the VF's BAR and DMA rings, the virtqueues).
    pub fn next(&mut self, cpu: usize, now: Time, dev: &mut Devices) -> Action {
        self.on_cpu(cpu);
        loop {
            let cpu = &mut self.cpus[self.on];
            if std::mem::take(&mut cpu.if_rose) {
                return Action::InterruptsEnabled;
            }
            if cpu.ipis_queued {
                if let Some(c) = cpu.ipi_pending.pop_first() {
                    // smp_send_reschedule: a fixed IPI to the CPU.
                    let c = c as u32;
                    self.counters.ipis_sent += 1;
                    return Action::Op(self.ipi(c, RESCHEDULE_VECTOR));
                }
                if let Some(c) = cpu.call_ipi_pending.pop_first() {
                    // smp_call_function_single_async → generic_exec_single:
                    // the csd went on an empty call-single queue, so
                    // arch_send_call_function_single_ipi sends the IPI.
                    let c = c as u32;
                    self.counters.ipis_sent += 1;
                    self.rps_counters.ipis += 1;
                    return Action::Op(self.ipi(c, rps::CALL_FUNCTION_SINGLE_VECTOR));
                }
                cpu.ipis_queued = false;
            }
            if let Some(to) = self
                .ipi_latency
                .as_ref()
                .filter(|p| p.due && p.from == self.on)
                .map(|p| p.to as u32)
            {
                self.ipi_probe_sent(now);
                self.counters.ipis_sent += 1;
                return Action::Op(self.ipi(to, rps::CALL_FUNCTION_SINGLE_VECTOR));
            }
            let cpu = &mut self.cpus[self.on];
            let Some(&f) = cpu.frames.last() else {
                if let Some(a) = self.task_context(now, dev) {
                    let cpu = &self.cpus[self.on];
                    if cpu.ipis_queued
                        && !(cpu.ipi_pending.is_empty() && cpu.call_ipi_pending.is_empty())
                        && matches!(a, Action::Spin | Action::Op(KernelOp::Idle))
                    {
                        // The IPIs a wake-up here asked for go out before
                        // the CPU idles.
                        continue;
                    }
                    return a;
                }
                continue;
            };
            let top = cpu.frames.len() - 1;
            if f.compute > 0 {
                return Action::Compute(f.compute);
            }
            if let Some(a) = self.frame_step(top, f, now, dev) {
                return a;
            }
        }
    }

    /// `apic->send_IPI`: a fixed IPI, or with the DID module's
    /// replacement a posted one (did-implementation.md §3 "IPI").
    fn ipi(&self, cpu: u32, vector: u8) -> KernelOp {
        if self.cpus[self.on].dtid {
            KernelOp::PostedIpi { cpu, vector }
        } else {
            KernelOp::SendIpi { cpu, vector }
        }
    }

    fn set_stage(&mut self, top: usize, stage: u8, compute: Time) {
        let compute = self.vary(compute);
        let f = &mut self.cpus[self.on].frames[top];
        f.stage = stage;
        f.compute = compute;
    }

    fn frame_step(&mut self, top: usize, f: Frame, now: Time, dev: &mut Devices) -> Option<Action> {
        match f.kind {
            // The clockevent's one-shot setup, one register write a step,
            // then the first programming.
            FrameKind::Boot if f.stage < self.cfg.clockevent.init_steps => {
                self.set_stage(top, f.stage + 1, 0);
                Some(Action::Op(KernelOp::ClockeventInit {
                    step: f.stage,
                    vector: self.cfg.timer_vector,
                }))
            }
            FrameKind::Boot => {
                self.pop();
                self.set_if(true);
                if self.cfg.tick == TickMode::Periodic {
                    self.start_tick(now);
                }
                if self.cfg.did_module {
                    // Loaded after boot; its ioctls run with IRQs off.
                    self.push(FrameKind::DidModule, 0, false);
                }
                if self.on == 0 && self.cfg.wait_driver.is_some_and(|d| d.announce.is_some()) {
                    self.push(FrameKind::DriverAnnounce, 0, false);
                }
                self.reprogram(now).map(Action::Op)
            }
            FrameKind::DriverAnnounce => {
                self.pop();
                let (nr, arg) = self.cfg.wait_driver.and_then(|d| d.announce)?;
                Some(Action::Op(KernelOp::Hypercall { nr, arg }))
            }
            FrameKind::DidModule => {
                use did_module::EnableStep;
                self.set_stage(top, f.stage + 1, 0);
                let cpu = self.on as u32;
                match did_module::enable_step(f.stage) {
                    EnableStep::Hypercall(nr) => Some(Action::Op(KernelOp::Hypercall {
                        nr,
                        arg: u64::from(cpu),
                    })),
                    EnableStep::PirTimerBit => Some(Action::Op(KernelOp::PirSet {
                        cpu,
                        vector: self.cfg.timer_vector,
                    })),
                    EnableStep::ArmTimer => {
                        self.cpus[self.on].dtid = true;
                        self.cpus[self.on].programmed = None;
                        self.reprogram(now).map(Action::Op)
                    }
                    EnableStep::Done => {
                        self.pop();
                        None
                    }
                }
            }
            FrameKind::Irq { vector } => self.irq_step(top, f, vector, now, dev),
            FrameKind::Softirq { round, queue } => {
                if f.stage == 0 && self.tx_ready() {
                    // TCP output (ACKs) leaves inline from the poll.
                    self.push_net_tx();
                    return None;
                }
                self.softirq_step(top, f, round, queue, now, dev.nic)
            }
            FrameKind::VirtioPoll { round } => {
                if f.stage == 0 && self.tx_ready() {
                    // TCP output the received segments caused (ACKs)
                    // leaves inline, from this softirq.
                    self.push_net_tx();
                    return None;
                }
                self.virtio_poll_step(top, f.stage, round, now, dev)
            }
            FrameKind::NetTx => self.net_tx_step(top, f.stage, now, dev),
            FrameKind::Backlog { round } => {
                if f.stage == 0 && self.tx_ready() {
                    // TCP output the segments caused leaves inline.
                    self.push_net_tx();
                    return None;
                }
                self.backlog_step(top, f.stage, round, now);
                None
            }
            FrameKind::BlkSubmit => {
                let d = dev.virtio_blk.as_deref_mut();
                self.blk_submit_step(top, f.stage, now, d)
            }
            FrameKind::Switch { to } => match f.stage {
                0 => {
                    self.counters.context_switches += 1;
                    let from = self.cpus[self.on].current;
                    self.cpus[self.on].current = to;
                    self.set_stage(top, 1, 0);
                    if self.cfg.tick == TickMode::NohzIdle {
                        if to.is_none() && from.is_some() {
                            // tick_nohz_stop_sched_tick keeps the tick when
                            // the next timer is at most one jiffy away.
                            let next = self.cpus[self.on]
                                .hrtimers
                                .iter()
                                .filter(|h| h.1 != HrKind::Tick)
                                .map(|h| h.0)
                                .min();
                            if next.is_none_or(|t| t > now + self.tick_period()) {
                                self.stop_tick();
                            }
                        } else if to.is_some() && from.is_none() {
                            self.start_tick(now);
                        }
                    }
                    self.reprogram(now).map(Action::Op)
                }
                _ => {
                    self.pop();
                    None
                }
            },
            FrameKind::Nanosleep { task, until, wait } => match f.stage {
                0 => {
                    self.set_stage(top, 1, 0);
                    // A task sleeps on one timer at a time (an earlier one
                    // an early wake-up left armed is cancelled).
                    self.cpus[self.on]
                        .hrtimers
                        .retain(|h| h.1 != HrKind::Wake(task));
                    let ready = wait
                        && self.tasks[task]
                            .socket
                            .is_some_and(|s| !self.sockets[s].is_empty());
                    if until <= now || ready {
                        return self.reprogram(now).map(Action::Op);
                    }
                    self.tasks[task].state = TaskState::Sleeping;
                    self.cpus[self.on]
                        .hrtimers
                        .push((until, HrKind::Wake(task)));
                    self.reprogram(now).map(Action::Op)
                }
                _ => {
                    self.pop();
                    if self.tasks[task].state != TaskState::Runnable {
                        self.cpus[self.on].need_resched = true;
                    }
                    None
                }
            },
        }
    }

    /// A program that runs as the kernel (the vmexit micro-benchmarks)
    /// handles `vector` here, if it is its; one waiting on another CPU is
    /// made to look again.
    fn app_interrupt(&mut self, vector: u8, now: Time) {
        let (on, eoi_at) = (self.on, self.cpus[self.on].eoi_at);
        for t in 0..self.tasks.len() {
            if self.tasks[t].app.interrupt(on, vector, now, eoi_at) && self.tasks[t].cpu != on {
                let c = self.tasks[t].cpu;
                self.cpus[on].poke_pending.insert(c);
            }
        }
    }

    fn irq_step(
        &mut self,
        top: usize,
        f: Frame,
        vector: u8,
        now: Time,
        dev: &mut Devices,
    ) -> Option<Action> {
        let c = self.cfg.costs;
        let nest = self.cfg.irq_nesting;
        let is_timer = vector == self.cfg.timer_vector;
        let is_vf = self.cfg.vf.is_some()
            && vector.wrapping_sub(self.cfg.vf_vector) < self.cfg.vf_queues.max(1);
        match f.stage {
            // A wired NIC's handler masks at the device first (its MMIO
            // write precedes the EOI, which the model issues next).
            0 if is_vf && self.cfg.vf_wired_irq => {
                self.set_stage(top, 6, 0);
                self.cfg.vf.map(|vf| {
                    Action::Op(KernelOp::VfWrite {
                        vf,
                        reg: VfReg::Eimc(1),
                    })
                })
            }
            // Linux acks edge interrupts first (ack_APIC_irq before the handler).
            0 | 6 => {
                self.set_stage(top, 1, 0);
                if nest {
                    self.set_if(true);
                    return None;
                }
                self.cpus[self.on].in_service.clear(vector);
                self.cpus[self.on].eoi_at = now;
                Some(Action::Op(KernelOp::EndOfInterrupt { vector }))
            }
            // The DID module's timer handler (did-implementation.md §3):
            // re-set the PIR timer bit first, then return at once from an
            // early interrupt (any notification delivers the pre-set bit).
            1 if is_timer && self.cpus[self.on].dtid => {
                self.set_stage(top, 5, 0);
                Some(Action::Op(KernelOp::PirSet {
                    cpu: self.on as u32,
                    vector,
                }))
            }
            5 if self.cpus[self.on].programmed.is_some_and(|t| now < t) => {
                self.set_stage(top, 3, 0);
                None
            }
            1 | 5 => {
                let work = if is_timer {
                    self.counters.timer_irqs += 1;
                    // The one-shot clockevent has fired: it must be reprogrammed.
                    self.cpus[self.on].programmed = None;
                    let ticks = self.expire_hrtimers(now);
                    if ticks > 0 {
                        self.fair_tick();
                    }
                    self.app_interrupt(vector, now);
                    c.hrtimer_interrupt + ticks as Time * c.tick_handler
                } else if vector == RESCHEDULE_VECTOR && self.cpus.len() > 1 {
                    // scheduler_ipi: need_resched is already set; the
                    // switch happens on the way out.
                    self.counters.resched_irqs += 1;
                    0
                } else if vector == rps::CALL_FUNCTION_SINGLE_VECTOR
                    && (self.rps.is_some() || self.ipi_latency.is_some())
                {
                    // generic_smp_call_function_single_interrupt: every
                    // queued call runs (RPS's, the IPI test module's).
                    let probe = self.ipi_probe_received(now);
                    if self.rps.is_some() {
                        self.call_function_irq()
                    } else if probe {
                        c.call_function_ipi
                    } else {
                        0
                    }
                } else if let Some(d) = self.cfg.wait_driver.filter(|d| d.vector == vector) {
                    // The driver's handler: wake_up on its wait queue.
                    for t in 0..self.tasks.len() {
                        if std::mem::take(&mut self.tasks[t].on_driver) {
                            self.wake(t);
                        }
                    }
                    d.handler
                } else if is_vf {
                    self.counters.vf_irqs += 1;
                    // ixgbe_msix_clean_rings: this queue's NAPI, here.
                    let q = vector.wrapping_sub(self.cfg.vf_vector);
                    self.cpus[self.on].net_rx |= 1 << q;
                    c.vf_irq_handler
                } else if self.is_virtio_vector(vector) {
                    self.virtio_irq(vector, dev);
                    c.vf_irq_handler
                } else if self.is_blk_vector(vector) {
                    c.vf_irq_handler + self.blk_irq(now, dev.virtio_blk.as_deref_mut())
                } else {
                    self.app_interrupt(vector, now);
                    0
                };
                self.set_stage(top, 2, work);
                None
            }
            2 => {
                self.set_stage(top, 3, 0);
                if is_timer || self.is_blk_vector(vector) {
                    // A fired or cancelled first timer moves the clockevent.
                    return self.reprogram(now).map(Action::Op);
                }
                None
            }
            3 => {
                self.set_stage(top, 4, c.irq_exit);
                if nest {
                    self.cpus[self.on].if_flag = false;
                    self.cpus[self.on].in_service.clear(vector);
                    return Some(Action::Op(KernelOp::EndOfInterrupt { vector }));
                }
                None
            }
            _ => {
                self.pop();
                // irq_exit: pending softirqs run on the way out, IF on.
                self.raise_softirq();
                Some(Action::Returned(vector))
            }
        }
    }

    fn softirq_step(
        &mut self,
        top: usize,
        f: Frame,
        round: u32,
        queue: u8,
        now: Time,
        nic: &mut crate::hw::x86::nic::Nic,
    ) -> Option<Action> {
        let c = self.cfg.costs;
        let q = usize::from(queue);
        let Some(vf) = self.cfg.vf else {
            self.cpus[self.on].net_rx = 0;
            self.cpus[self.on].in_softirq = false;
            self.pop();
            return None;
        };
        match f.stage {
            0 => {
                if round == 0 && nic.tx_clean_on(vf, queue).unwrap_or(0) > 0 && self.tx_stopped {
                    // ixgbevf_clean_tx_irq: descriptors are free again.
                    self.tx_stopped = false;
                    self.tx_pending = true;
                }
                if round < self.cfg.napi_weight {
                    if let Ok(Some(p)) = nic.rx_poll_on(vf, queue) {
                        self.cpus[self.on].frames[top].kind = FrameKind::Softirq {
                            round: round + 1,
                            queue,
                        };
                        self.itr[q].count(p.len);
                        self.counters.rx_packets += 1;
                        let c = self.gro_receive(p.frame, now);
                        self.set_compute(top, c);
                        self.cleaned_unrefilled[q] += 1;
                        if self.cleaned_unrefilled[q] >= self.cfg.refill_batch {
                            let _ = nic.rx_refill_on(vf, queue, self.cleaned_unrefilled[q]);
                            self.cleaned_unrefilled[q] = 0;
                        }
                        return None;
                    }
                }
                if round >= self.cfg.napi_weight {
                    // Budget used: stay in polling mode, vector still masked.
                    if self.softirq_budget_spent() {
                        return None;
                    }
                    self.cpus[self.on].frames[top].kind = FrameKind::Softirq { round: 0, queue };
                    self.set_compute(top, c.napi_poll_base);
                    return None;
                }
                // Ring empty: napi_complete, then the dynamic ITR update.
                if self.cleaned_unrefilled[q] > 0 {
                    let _ = nic.rx_refill_on(vf, queue, self.cleaned_unrefilled[q]);
                    self.cleaned_unrefilled[q] = 0;
                }
                self.cpus[self.on].net_rx &= !(1 << queue);
                let flushed = self.gro_flush(now);
                let new = self.itr[q].update(&self.cfg.itr);
                self.set_stage(top, 1, c.itr_update + flushed);
                new.map(|v| {
                    Action::Op(KernelOp::VfWrite {
                        vf,
                        reg: VfReg::Eitr(queue, v),
                    })
                })
            }
            1 => {
                self.set_stage(top, 2, 0);
                Some(Action::Op(KernelOp::VfWrite {
                    vf,
                    reg: VfReg::Eims(1 << queue),
                }))
            }
            _ => {
                // net_rx_action's end: net_rps_action_and_irq_enable.
                self.rps_action();
                self.cpus[self.on].in_softirq = false;
                self.pop();
                self.raise_softirq();
                None
            }
        }
    }

    /// A NAPI poll used its weight: count it against `netdev_budget`. Once
    /// the budget is spent, net_rx_action stops and NET_RX continues in
    /// ksoftirqd, a thread that takes turns with the running task (the
    /// poll stays scheduled, the vector masked). Returns true if the
    /// softirq frame was left for that reason.
    fn softirq_budget_spent(&mut self) -> bool {
        self.cpus[self.on].softirq_done += self.cfg.napi_weight;
        if self.cpus[self.on].softirq_done < self.cfg.netdev_budget {
            return false;
        }
        // net_rx_action stops here: its IPIs go out now.
        self.rps_action();
        self.cpus[self.on].ksoftirqd = true;
        self.cpus[self.on].in_softirq = false;
        self.pop();
        true
    }

    /// Whether TCP output waits, the transmit queue is not stopped, and no
    /// other CPU runs it (`qdisc_run_begin`: one CPU at a time drains the
    /// queue; output another CPU adds meanwhile is taken by that one).
    fn tx_ready(&self) -> bool {
        self.tx_pending && !self.tx_stopped && self.tx_owner.is_none_or(|c| c == self.on)
    }

    /// Starts the transmit path on this CPU (it now owns the qdisc).
    fn push_net_tx(&mut self) {
        self.tx_owner = Some(self.on);
        self.tx_depth += 1;
        self.push(FrameKind::NetTx, 0, true);
    }

    /// The transmit path on this CPU is done (`qdisc_run_end` once the
    /// outermost one returns).
    pub(super) fn pop_net_tx(&mut self) {
        self.tx_depth = self.tx_depth.saturating_sub(1);
        if self.tx_depth == 0 {
            self.tx_owner = None;
        }
        self.pop();
    }

    /// `do_softirq` on the way out of an interrupt or softirq: NET_RX for
    /// the VF or virtio-net, else NET_TX for pending TCP output.
    fn raise_softirq(&mut self) {
        let cpu = &mut self.cpus[self.on];
        if cpu.in_softirq || cpu.ksoftirqd {
            return;
        }
        let c = self.cfg.costs;
        cpu.softirq_done = 0;
        let kind = if cpu.net_rx != 0 {
            FrameKind::Softirq {
                round: 0,
                queue: cpu.net_rx.trailing_zeros() as u8,
            }
        } else if cpu.napi_virtio {
            FrameKind::VirtioPoll { round: 0 }
        } else if cpu.backlog_poll {
            FrameKind::Backlog { round: 0 }
        } else {
            if self.tx_ready() {
                self.push_net_tx();
            }
            return;
        };
        cpu.in_softirq = true;
        self.push(kind, c.napi_poll_base, true);
    }

    fn task_context(&mut self, now: Time, dev: &mut Devices) -> Option<Action> {
        if self.blk_pending() {
            // submit_bio → the driver, before the task goes on.
            return None;
        }
        if self.tx_ready() {
            // Output a send() queued leaves before the task goes on.
            self.push_net_tx();
            return None;
        }
        if std::mem::take(&mut self.cpus[self.on].need_resched) {
            let next = self.pick();
            if next != self.cpus[self.on].current {
                self.push(
                    FrameKind::Switch { to: next },
                    self.cfg.costs.context_switch,
                    false,
                );
                return None;
            }
        }
        let cpu = &mut self.cpus[self.on];
        if cpu.ksoftirqd && (cpu.current.is_none() || cpu.task_stepped) {
            // ksoftirqd's turn: the deferred NET_RX poll goes on.
            cpu.ksoftirqd = false;
            cpu.task_stepped = false;
            cpu.softirq_done = 0;
            cpu.in_softirq = true;
            let c = self.cfg.costs;
            let kind = if cpu.net_rx != 0 {
                FrameKind::Softirq {
                    round: 0,
                    queue: cpu.net_rx.trailing_zeros() as u8,
                }
            } else if cpu.backlog_poll && !cpu.napi_virtio {
                FrameKind::Backlog { round: 0 }
            } else {
                FrameKind::VirtioPoll { round: 0 }
            };
            self.push(kind, c.napi_poll_base + c.context_switch, true);
            return None;
        }
        let Some(t) = cpu.current else {
            return Some(match self.cfg.idle {
                IdleMode::Halt if cpu.if_flag => Action::Op(KernelOp::Idle),
                _ => Action::Spin,
            });
        };
        if self.tasks[t].state != TaskState::Runnable {
            cpu.need_resched = true;
            return None;
        }
        if self.tasks[t].compute > 0 {
            return Some(Action::Compute(self.tasks[t].compute));
        }
        let task = &mut self.tasks[t];
        let has_socket = task.socket.is_some();
        let mut sys = Sys {
            now,
            socket: task.socket.map(|s| &mut self.sockets[s]),
            tcp: None,
            conns: None,
            blk: (self.blk_task == Some(t)).then_some(&mut self.blk),
            udp_tx: has_socket.then_some(&mut self.udp_tx),
            shared: dev.shared.as_deref_mut(),
            vsock: dev.vsock.as_deref_mut(),
        };
        match (task.tcp, task.multi_tcp) {
            (Some(s), _) => sys.tcp = Some(&mut self.tcp_socks[s].tcp),
            (None, true) => {
                task.ready.sort_unstable();
                sys.conns = Some(
                    app::Conns::new(
                        &mut self.tcp_socks[..],
                        &mut self.touched,
                        &mut self.touched_seen[..],
                    )
                    .with_ready(&task.ready),
                )
            }
            _ => {}
        }
        let step = task.app.step(&mut sys);
        self.cpus[self.on].task_stepped = true;
        if !self.udp_tx.is_empty() {
            // sendto() → udp_sendmsg → dev_queue_xmit.
            self.tx_pending = true;
        }
        if let Some(s) = self.tasks[t].tcp {
            // send()/recv() may have queued data or a window update.
            self.tx_mark(s);
            self.tcp_timer_sync(s, now);
        }
        if self.tasks[t].multi_tcp {
            // It has seen the ready list.
            for i in 0..self.tasks[t].ready.len() {
                let s = self.tasks[t].ready[i];
                self.tcp_socks[s].ready = false;
            }
            self.tasks[t].ready.clear();
            // Only the connections the program acted on can have news.
            while let Some(s) = self.touched.pop() {
                self.touched_seen[s] = false;
                self.tcp_timer_sync(s, now);
                self.tx_mark(s);
            }
        }
        match step {
            TaskStep::Compute(d) => {
                let d = if self.tasks[t].app.varies() {
                    self.vary(d)
                } else {
                    d
                };
                self.fair_charge(t, d);
                self.tasks[t].compute = d.max(NS / 1000);
                Some(Action::Compute(self.tasks[t].compute))
            }
            TaskStep::Block => {
                self.tasks[t].state = TaskState::Blocked;
                // A datagram may have arrived meanwhile: recheck like
                // prepare_to_wait + condition.
                if self.tasks[t]
                    .socket
                    .is_some_and(|s| !self.sockets[s].is_empty())
                    || (self.blk_task == Some(t) && !self.blk.done.is_empty())
                {
                    self.tasks[t].state = TaskState::Runnable;
                    return None;
                }
                self.udp_wait_for_space(t);
                self.cpus[self.on].need_resched = true;
                None
            }
            TaskStep::DriverKick => {
                // The ioctl's system call, then the OUT to the port (the
                // task goes on at its next step).
                let port = self.cfg.wait_driver.and_then(|d| d.doorbell)?;
                self.tasks[t].compute = self.vary(self.cfg.costs.syscall);
                Some(Action::Op(KernelOp::QueueNotify { port, value: 0 }))
            }
            TaskStep::Notify { port, value } => {
                Some(Action::Op(KernelOp::QueueNotify { port, value }))
            }
            TaskStep::WaitDriver => {
                // The waiter re-checked its condition in this step
                // (libCanal's re-check after arming, vcanal.md §7), so a
                // completion interrupt from now on finds it asleep.
                self.tasks[t].state = TaskState::Blocked;
                self.tasks[t].on_driver = true;
                self.cpus[self.on].need_resched = true;
                None
            }
            TaskStep::SleepUntil(until) | TaskStep::WaitUntil(until) => {
                let wait = matches!(step, TaskStep::WaitUntil(_));
                self.push(
                    FrameKind::Nanosleep {
                        task: t,
                        until,
                        wait,
                    },
                    self.cfg.costs.syscall,
                    true,
                );
                None
            }
            TaskStep::Kernel(op) => Some(Action::Op(op)),
            TaskStep::Cli => {
                self.set_if(false);
                None
            }
            TaskStep::Sti => {
                self.set_if(true);
                None
            }
            TaskStep::SafeHalt => {
                // IF rises in the STI's shadow: no look at pending
                // interrupts before the HLT.
                self.cpus[self.on].if_flag = true;
                Some(Action::Op(KernelOp::Idle))
            }
            TaskStep::Spin => Some(Action::Spin),
            TaskStep::Exit => {
                self.tasks[t].state = TaskState::Exited;
                self.counters.tasks_exited += 1;
                self.cpus[self.on].need_resched = true;
                None
            }
        }
    }
}

/// A guest configuration for unit tests: no devices, every cost zero.
#[cfg(test)]
pub(crate) fn test_config() -> GuestConfig {
    let z = 0;
    crate::guest::GuestConfig {
        timer_vector: 0xef,
        did_module: false,
        vf_vector: 0x41,
        vf: None,
        vf_queues: 1,
        vf_wired_irq: false,
        virtio_net: None,
        virtio_blk: None,
        wait_driver: None,
        rps_cpus: Vec::new(),
        hz: 1000,
        tick: crate::guest::TickMode::Periodic,
        irq_nesting: false,
        idle: crate::guest::IdleMode::Poll,
        clockevent: Clockevent {
            tick: 1,
            min_delta_ticks: 0xF,
            init_steps: 2,
        },
        rcvbuf_packets: 16,
        napi_weight: 64,
        netdev_budget: 300,
        refill_batch: 16,
        gro: false,
        itr: crate::guest::itr::ItrParams {
            lowest_reg: 0,
            low_reg: 0,
            bulk_reg: 0,
            low_threshold: 0,
            bulk_threshold: 0,
            driver: crate::guest::itr::ItrDriver::Static,
        },
        costs: crate::guest::GuestCosts {
            irq_entry: z,
            irq_exit: z,
            hrtimer_interrupt: z,
            tick_handler: z,
            vf_irq_handler: z,
            napi_poll_base: z,
            rx_per_packet: z,
            gro_merge: z,
            itr_update: z,
            context_switch: z,
            syscall: z,
            tcp_rx_segment: z,
            tcp_tx_segment: z,
            udp_tx_datagram: z,
            virtio_xmit: z,
            vf_xmit: z,
            blk_submit: z,
            blk_elv_insert: z,
            blk_dispatch: z,
            blk_complete: z,
            icmp_echo: z,
            rx_protocol: z,
            rps_enqueue: z,
            call_function_ipi: z,
            tcp_conn_request: z,
            tcp_syn_recv_sock: z,
        },
    }
}

#[cfg(test)]
mod per_cpu_tests {
    use super::*;

    /// Each CPU's state stays its own while calls move between CPUs in any
    /// order (it is indexed in place, not swapped in).
    #[test]
    fn per_cpu_state_follows_its_cpu_across_switches() {
        let mut k = Kernel::smp(test_config(), 3);
        for c in 0..3 {
            assert!(k.in_service(c).is_empty());
        }
        let frames: Vec<usize> = k.cpus.iter().map(|c| c.frames.len()).collect();
        k.take_interrupt(1, 0x40);
        k.take_interrupt(2, 0x50);
        k.take_interrupt(1, 0x60);
        k.take_interrupt(0, 0x70);
        let vectors = |k: &Kernel, c: usize| k.in_service(c).iter().collect::<Vec<_>>();
        assert_eq!(vectors(&k, 0), [0x70]);
        assert_eq!(vectors(&k, 1), [0x40, 0x60]);
        assert_eq!(vectors(&k, 2), [0x50]);
        for c in 0..3 {
            assert!(!k.interrupts_enabled(c));
        }
        let pushed: Vec<usize> = (0..3).map(|c| k.cpus[c].frames.len() - frames[c]).collect();
        assert_eq!(pushed, [1, 2, 1]);
        assert_eq!(k.counters.irqs, 4);
    }
}
