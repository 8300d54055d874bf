//! The Interrupt Translation Service (GICv3 spec §5.2 "The ITS", §5.3 "ITS
//! commands", §9 GICv4 "Virtual LPI support"; did-arm.md §2.6 "Proposed, as
//! an LPI through the ITS").
//!
//! A device's MSI carries a DeviceID (from the bus) and an EventID (the data
//! written to GITS_TRANSLATER). The ITS walks its tables:
//!
//! | table | indexed by | entry |
//! |---|---|---|
//! | device table | DeviceID | the device's ITT (size in EventID bits) |
//! | ITT | EventID | physical ITE {pINTID, ICID} or virtual ITE {vINTID, vPEID, doorbell} |
//! | collection table | ICID | target redistributor (a core: GITS_TYPER.PTA = 0) |
//! | vPE table (GICv4) | vPEID | the redistributor the vPE is mapped to |
//!
//! and the outcome is a physical LPI made pending at a core, a vLPI posted to
//! a resident vPE (no hypervisor), a vLPI left pending for a non-resident
//! vPE with its doorbell rung, or a translation fault — counted, never a
//! panic. Software fills the tables with commands (MAPD, MAPC, MAPTI, ...),
//! queued GITS_CBASER/CWRITER/CREADR style ([`Its::submit`] then
//! [`Its::process`]) or executed at once with [`Its::command`]. Commands are
//! the 32-byte packets of §5.3, see [`ItsCommand::encode`]. A command that
//! fails is counted and skipped (the IMPLEMENTATION DEFINED choice other than
//! stalling the queue).

use crate::hw::arm::intid::{GicError, LPI_BASE};
use crate::hw::arm::params::GicParams;
use crate::hw::arm::priority::Group;
use crate::hw::arm::redistributor::{
    Doorbell, LpiConfigTable, Redistributor, VlpiPost, VlpiTables,
};

/// Command opcodes (DW0 bits \[7:0\]).
pub mod opcode {
    /// MOVI.
    pub const MOVI: u8 = 0x01;
    /// INT.
    pub const INT: u8 = 0x03;
    /// CLEAR.
    pub const CLEAR: u8 = 0x04;
    /// SYNC.
    pub const SYNC: u8 = 0x05;
    /// MAPD.
    pub const MAPD: u8 = 0x08;
    /// MAPC.
    pub const MAPC: u8 = 0x09;
    /// MAPTI.
    pub const MAPTI: u8 = 0x0A;
    /// MAPI.
    pub const MAPI: u8 = 0x0B;
    /// INV.
    pub const INV: u8 = 0x0C;
    /// INVALL.
    pub const INVALL: u8 = 0x0D;
    /// MOVALL.
    pub const MOVALL: u8 = 0x0E;
    /// DISCARD.
    pub const DISCARD: u8 = 0x0F;
    /// VMOVI.
    pub const VMOVI: u8 = 0x21;
    /// VMOVP.
    pub const VMOVP: u8 = 0x22;
    /// VSGI (GICv4.1).
    pub const VSGI: u8 = 0x23;
    /// VSYNC.
    pub const VSYNC: u8 = 0x25;
    /// VMAPP.
    pub const VMAPP: u8 = 0x29;
    /// VMAPTI.
    pub const VMAPTI: u8 = 0x2A;
    /// VMAPI.
    pub const VMAPI: u8 = 0x2B;
    /// VINVALL.
    pub const VINVALL: u8 = 0x2D;
}

/// The doorbell field value meaning "no doorbell".
pub const NO_DOORBELL: u32 = 1023;

/// GITS register offsets.
pub mod regs {
    /// Control (Enabled in bit 0, Quiescent in bit 31).
    pub const CTLR: u64 = 0x0000;
    /// Type (64-bit, read-only).
    pub const TYPER: u64 = 0x0008;
    /// Command queue write pointer (byte offset).
    pub const CWRITER: u64 = 0x0088;
    /// Command queue read pointer (byte offset).
    pub const CREADR: u64 = 0x0090;
    /// GICv4.1 vSGI generation (64-bit, write-only), in the ITS's vSGI
    /// frame at +128 KiB: vPEID in \[47:32\], vINTID in \[3:0\] (Linux's
    /// `its_sgi_set_irqchip_state` writes it to make a vSGI pending).
    pub const SGIR: u64 = 0x2_0020;
}

/// GITS_TYPER.VMAPP: the ITS is GICv4.1 (Linux's `is_v4_1()` reads it).
pub const TYPER_VMAPP: u64 = 1 << 40;

/// One ITS command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsCommand {
    /// Maps DeviceID to an ITT of 2^(size+1) events, or unmaps it.
    Mapd {
        /// DeviceID.
        device: u32,
        /// EventID bits minus one.
        size: u8,
        /// V.
        valid: bool,
    },
    /// Maps a collection to a redistributor (core), or unmaps it.
    Mapc {
        /// ICID.
        icid: u16,
        /// RDbase as a processor number.
        target: usize,
        /// V.
        valid: bool,
    },
    /// Maps an event to physical LPI `pintid` in collection `icid`.
    Mapti {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// The LPI.
        pintid: u32,
        /// ICID.
        icid: u16,
    },
    /// MAPTI with pINTID = EventID.
    Mapi {
        /// DeviceID.
        device: u32,
        /// EventID, also the LPI.
        event: u32,
        /// ICID.
        icid: u16,
    },
    /// Moves an event to another collection (its pending state follows).
    Movi {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// The new ICID.
        icid: u16,
    },
    /// Makes the target redistributor re-read the event's LPI configuration.
    Inv {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Makes a collection's redistributor re-read all LPI configuration.
    Invall {
        /// ICID.
        icid: u16,
    },
    /// Clears the event's pending state and unmaps it.
    Discard {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Triggers the event as an MSI would.
    Int {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Clears the event's pending state.
    Clear {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Waits for earlier commands' effects at a redistributor (immediate
    /// here).
    Sync {
        /// RDbase as a processor number.
        target: usize,
    },
    /// Moves every pending LPI from one redistributor to another.
    Movall {
        /// Source core.
        from: usize,
        /// Destination core.
        to: usize,
    },
    /// Maps a vPE to a redistributor (GICv4), or unmaps it.
    Vmapp {
        /// vPEID.
        vpeid: u16,
        /// RDbase as a processor number.
        target: usize,
        /// V.
        valid: bool,
        /// GICv4.1 default doorbell (None: 1023).
        default_doorbell: Option<u32>,
    },
    /// Maps an event to vLPI `vintid` of `vpeid`.
    Vmapti {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// vPEID.
        vpeid: u16,
        /// vINTID.
        vintid: u32,
        /// GICv4.0 doorbell pINTID (None: 1023).
        doorbell: Option<u32>,
    },
    /// VMAPTI with vINTID = EventID.
    Vmapi {
        /// DeviceID.
        device: u32,
        /// EventID, also the vINTID.
        event: u32,
        /// vPEID.
        vpeid: u16,
        /// Doorbell pINTID (None: 1023).
        doorbell: Option<u32>,
    },
    /// Moves a virtual event to another vPE (its pending state follows).
    Vmovi {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// New vPEID.
        vpeid: u16,
        /// New doorbell (None: 1023).
        doorbell: Option<u32>,
    },
    /// Moves a vPE to another redistributor.
    Vmovp {
        /// vPEID.
        vpeid: u16,
        /// RDbase as a processor number.
        target: usize,
    },
    /// Synchronizes a vPE (immediate here).
    Vsync {
        /// vPEID.
        vpeid: u16,
    },
    /// Invalidates a vPE's cached vLPI configuration (none is cached here).
    Vinvall {
        /// vPEID.
        vpeid: u16,
    },
    /// GICv4.1: configures or clears a vSGI of a vPE.
    Vsgi {
        /// vPEID.
        vpeid: u16,
        /// The vSGI, 0..=15.
        sgi: u8,
        /// Priority (upper 4 bits kept, as in the packet).
        priority: u8,
        /// Group.
        group: Group,
        /// Enable.
        enable: bool,
        /// Clear the pending state instead of configuring.
        clear: bool,
    },
}

/// Why a command failed, or why a translation faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ItsError {
    /// The opcode is not a command this ITS knows.
    #[error("unknown ITS command {0:#x}")]
    UnknownCommand(u8),
    /// A DeviceID past the device table.
    #[error("DeviceID {0} is beyond the device table")]
    DeviceOutOfRange(u32),
    /// A DeviceID with no valid DTE.
    #[error("DeviceID {0} is not mapped")]
    UnmappedDevice(u32),
    /// An EventID past the device's ITT.
    #[error("EventID {event} is beyond device {device}'s ITT")]
    EventOutOfRange {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// An event with no ITE.
    #[error("EventID {event} of device {device} is not mapped")]
    UnmappedEvent {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// An ITT larger than the ITS supports.
    #[error("an ITT of {0} EventID bits is too large")]
    IttTooLarge(u8),
    /// An ICID past the collection table.
    #[error("ICID {0} is beyond the collection table")]
    CollectionOutOfRange(u16),
    /// An ICID with no valid collection.
    #[error("ICID {0} is not mapped")]
    UnmappedCollection(u16),
    /// A target redistributor that does not exist.
    #[error("redistributor {0} does not exist")]
    TargetOutOfRange(usize),
    /// A pINTID/vINTID/doorbell that is not an implemented LPI.
    #[error("INTID {0} is not a valid LPI")]
    InvalidLpi(u32),
    /// A vPEID past the vPE table.
    #[error("vPE {0} is beyond the vPE table")]
    VpeOutOfRange(u16),
    /// A vPEID with no valid vPE table entry.
    #[error("vPE {0} is not mapped")]
    UnmappedVpe(u16),
    /// A physical command on a virtual ITE or the reverse.
    #[error("EventID {event} of device {device} has the other kind of ITE")]
    WrongIteKind {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// A GICv4/v4.1 command on a GIC without it.
    #[error("{0} is not supported by this ITS")]
    Unsupported(&'static str),
    /// Translation requested while GITS_CTLR.Enabled is 0.
    #[error("the ITS is disabled")]
    Disabled,
    /// The command queue has no free slot.
    #[error("the command queue is full")]
    QueueFull,
    /// The target redistributor refused (e.g. its LPIs are disabled).
    #[error("redistributor: {0}")]
    Redistributor(GicErrorKind),
}

/// The redistributor errors an ITS operation can run into (a copyable
/// summary of [`GicError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GicErrorKind {
    /// GICR_CTLR.EnableLPIs is 0.
    LpisDisabled,
    /// Anything else (an INTID or vPE out of range).
    Other,
}

impl std::fmt::Display for GicErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GicErrorKind::LpisDisabled => write!(f, "LPIs are disabled"),
            GicErrorKind::Other => write!(f, "bad INTID or vPE"),
        }
    }
}

impl From<GicError> for ItsError {
    fn from(e: GicError) -> Self {
        ItsError::Redistributor(match e {
            GicError::LpisDisabled => GicErrorKind::LpisDisabled,
            _ => GicErrorKind::Other,
        })
    }
}

/// An interrupt translation table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ite {
    /// No mapping.
    Unmapped,
    /// A physical LPI in a collection.
    Physical {
        /// The LPI.
        pintid: u32,
        /// Its collection.
        icid: u16,
    },
    /// A vLPI of a vPE (GICv4).
    Virtual {
        /// The vLPI.
        vintid: u32,
        /// The vPE.
        vpeid: u16,
        /// The GICv4.0 doorbell, if any.
        doorbell: Option<u32>,
    },
}

/// A vPE table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VpeEntry {
    /// The redistributor (core) the vPE is mapped to.
    pub core: usize,
    /// Its GICv4.1 default doorbell.
    pub default_doorbell: Option<u32>,
}

/// What translating an MSI (or an INT command) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiOutcome {
    /// A physical LPI was made pending at `core`.
    Lpi {
        /// The core.
        core: usize,
        /// The LPI.
        intid: u32,
        /// False if it was pending already (merged).
        newly_pending: bool,
    },
    /// A vLPI reached the resident vPE at `core`: no hypervisor involved.
    VlpiResident {
        /// The core.
        core: usize,
        /// The vPE.
        vpeid: u16,
        /// The vLPI.
        vintid: u32,
        /// False if it was pending already.
        newly_pending: bool,
    },
    /// A vLPI waits for a non-resident vPE; its doorbell (if any) was rung
    /// at `core`.
    VlpiPending {
        /// The core the vPE is mapped to.
        core: usize,
        /// The vPE.
        vpeid: u16,
        /// The vLPI.
        vintid: u32,
        /// False if it was pending already.
        newly_pending: bool,
        /// The doorbell rung.
        doorbell: Option<Doorbell>,
    },
    /// Translation failed; nothing was delivered.
    Fault(ItsError),
}

/// The rest of the GIC an ITS command or translation acts on.
pub struct ItsTargets<'a> {
    /// Every core's redistributor, by core index.
    pub redists: &'a mut [Redistributor],
    /// The LPI configuration table (for INV/INVALL).
    pub lpi_config: &'a LpiConfigTable,
    /// The vPEs' pending tables (GICv4).
    pub vlpis: &'a mut VlpiTables,
}

/// Event counts of the ITS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItsCounters {
    /// MSIs translated (faults included).
    pub translations: u64,
    /// Translations that faulted.
    pub faults: u64,
    /// Physical LPIs delivered.
    pub lpis: u64,
    /// vLPIs delivered to a resident vPE.
    pub vlpis_resident: u64,
    /// vLPIs left pending for a non-resident vPE.
    pub vlpis_pending: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Commands executed successfully.
    pub commands: u64,
    /// Commands that failed (and were skipped).
    pub command_errors: u64,
}

/// No collection/vPE mapped.
const UNMAPPED: usize = usize::MAX;

/// The ITS.
#[derive(Clone, Debug)]
pub struct Its {
    cores: usize,
    gicv4: bool,
    gicv4_1: bool,
    lpi_end: u32,
    vlpi_end: u32,
    max_event_bits: u8,
    /// Per DeviceID: its ITT's EventID bits, 0 = unmapped.
    devices: Box<[u8]>,
    /// Every device's ITT, at a stride of 2^max_event_bits.
    ittes: Box<[Ite]>,
    collections: Box<[usize]>,
    vpes: Box<[Option<VpeEntry>]>,
    queue: Box<[[u64; 4]]>,
    creadr: usize,
    cwriter: usize,
    enabled: bool,
    last_error: Option<ItsError>,
    counters: ItsCounters,
}

/// Two distinct elements of a slice, mutably.
fn two_mut<T>(s: &mut [T], a: usize, b: usize) -> Option<(&mut T, &mut T)> {
    if a == b || a >= s.len() || b >= s.len() {
        return None;
    }
    if a < b {
        let (l, r) = s.split_at_mut(b);
        Some((&mut l[a], &mut r[0]))
    } else {
        let (l, r) = s.split_at_mut(a);
        Some((&mut r[0], &mut l[b]))
    }
}

/// Field `[hi:lo]` of a command doubleword.
fn field(dw: u64, hi: u32, lo: u32) -> u64 {
    (dw >> lo) & (u64::MAX >> (63 - (hi - lo)))
}

/// A doorbell field: 1023 means none.
fn doorbell_field(v: u64) -> Option<u32> {
    (v as u32 != NO_DOORBELL).then_some(v as u32)
}

fn doorbell_bits(d: Option<u32>) -> u64 {
    u64::from(d.unwrap_or(NO_DOORBELL))
}

impl ItsCommand {
    /// The 32-byte command packet (GICv3 spec §5.3; field positions as in
    /// the command descriptions: DeviceID DW0\[63:32\], EventID DW1\[31:0\],
    /// pINTID DW1\[63:32\], ICID DW2\[15:0\], RDbase DW2\[51:16\], V DW2\[63\],
    /// vPEID DW1\[47:32\], vINTID DW2\[31:0\], doorbell DW2\[63:32\]).
    pub fn encode(&self) -> [u64; 4] {
        let dev = |d: u32| u64::from(d) << 32;
        let rd = |c: usize| ((c as u64) & 0xF_FFFF_FFFF) << 16;
        let v = |b: bool| u64::from(b) << 63;
        let vpe = |p: u16| u64::from(p) << 32;
        match *self {
            ItsCommand::Mapd {
                device,
                size,
                valid,
            } => [
                u64::from(opcode::MAPD) | dev(device),
                u64::from(size & 0x1F),
                v(valid),
                0,
            ],
            ItsCommand::Mapc {
                icid,
                target,
                valid,
            } => [
                u64::from(opcode::MAPC),
                0,
                u64::from(icid) | rd(target) | v(valid),
                0,
            ],
            ItsCommand::Mapti {
                device,
                event,
                pintid,
                icid,
            } => [
                u64::from(opcode::MAPTI) | dev(device),
                u64::from(event) | (u64::from(pintid) << 32),
                u64::from(icid),
                0,
            ],
            ItsCommand::Mapi {
                device,
                event,
                icid,
            } => [
                u64::from(opcode::MAPI) | dev(device),
                u64::from(event),
                u64::from(icid),
                0,
            ],
            ItsCommand::Movi {
                device,
                event,
                icid,
            } => [
                u64::from(opcode::MOVI) | dev(device),
                u64::from(event),
                u64::from(icid),
                0,
            ],
            ItsCommand::Inv { device, event } => {
                [u64::from(opcode::INV) | dev(device), u64::from(event), 0, 0]
            }
            ItsCommand::Invall { icid } => [u64::from(opcode::INVALL), 0, u64::from(icid), 0],
            ItsCommand::Discard { device, event } => [
                u64::from(opcode::DISCARD) | dev(device),
                u64::from(event),
                0,
                0,
            ],
            ItsCommand::Int { device, event } => {
                [u64::from(opcode::INT) | dev(device), u64::from(event), 0, 0]
            }
            ItsCommand::Clear { device, event } => [
                u64::from(opcode::CLEAR) | dev(device),
                u64::from(event),
                0,
                0,
            ],
            ItsCommand::Sync { target } => [u64::from(opcode::SYNC), 0, rd(target), 0],
            ItsCommand::Movall { from, to } => [u64::from(opcode::MOVALL), 0, rd(from), rd(to)],
            ItsCommand::Vmapp {
                vpeid,
                target,
                valid,
                default_doorbell,
            } => [
                u64::from(opcode::VMAPP),
                vpe(vpeid) | doorbell_bits(default_doorbell),
                rd(target) | v(valid),
                0,
            ],
            ItsCommand::Vmapti {
                device,
                event,
                vpeid,
                vintid,
                doorbell,
            } => [
                u64::from(opcode::VMAPTI) | dev(device),
                u64::from(event) | vpe(vpeid),
                u64::from(vintid) | (doorbell_bits(doorbell) << 32),
                0,
            ],
            ItsCommand::Vmapi {
                device,
                event,
                vpeid,
                doorbell,
            } => [
                u64::from(opcode::VMAPI) | dev(device),
                u64::from(event) | vpe(vpeid),
                doorbell_bits(doorbell) << 32,
                0,
            ],
            ItsCommand::Vmovi {
                device,
                event,
                vpeid,
                doorbell,
            } => [
                u64::from(opcode::VMOVI) | dev(device),
                u64::from(event) | vpe(vpeid),
                (doorbell_bits(doorbell) << 32) | 1,
                0,
            ],
            ItsCommand::Vmovp { vpeid, target } => {
                [u64::from(opcode::VMOVP), vpe(vpeid), rd(target), 0]
            }
            ItsCommand::Vsync { vpeid } => [u64::from(opcode::VSYNC), vpe(vpeid), 0, 0],
            ItsCommand::Vinvall { vpeid } => [u64::from(opcode::VINVALL), vpe(vpeid), 0, 0],
            ItsCommand::Vsgi {
                vpeid,
                sgi,
                priority,
                group,
                enable,
                clear,
            } => [
                u64::from(opcode::VSGI)
                    | (u64::from(enable) << 8)
                    | (u64::from(clear) << 9)
                    | (u64::from(group == Group::G1) << 10)
                    | (u64::from(priority >> 4) << 20)
                    | (u64::from(sgi & 0xF) << 32),
                vpe(vpeid),
                0,
                0,
            ],
        }
    }

    /// Decodes a command packet; an unknown opcode is refused. Field values
    /// are checked when the command executes.
    pub fn decode(p: [u64; 4]) -> Result<Self, ItsError> {
        let op = p[0] as u8;
        let device = field(p[0], 63, 32) as u32;
        let event = field(p[1], 31, 0) as u32;
        let vpeid = field(p[1], 47, 32) as u16;
        let icid = field(p[2], 15, 0) as u16;
        let target = field(p[2], 51, 16) as usize;
        let valid = p[2] >> 63 != 0;
        let doorbell = doorbell_field(field(p[2], 63, 32));
        Ok(match op {
            opcode::MAPD => ItsCommand::Mapd {
                device,
                size: field(p[1], 4, 0) as u8,
                valid,
            },
            opcode::MAPC => ItsCommand::Mapc {
                icid,
                target,
                valid,
            },
            opcode::MAPTI => ItsCommand::Mapti {
                device,
                event,
                pintid: field(p[1], 63, 32) as u32,
                icid,
            },
            opcode::MAPI => ItsCommand::Mapi {
                device,
                event,
                icid,
            },
            opcode::MOVI => ItsCommand::Movi {
                device,
                event,
                icid,
            },
            opcode::INV => ItsCommand::Inv { device, event },
            opcode::INVALL => ItsCommand::Invall { icid },
            opcode::DISCARD => ItsCommand::Discard { device, event },
            opcode::INT => ItsCommand::Int { device, event },
            opcode::CLEAR => ItsCommand::Clear { device, event },
            opcode::SYNC => ItsCommand::Sync { target },
            opcode::MOVALL => ItsCommand::Movall {
                from: target,
                to: field(p[3], 51, 16) as usize,
            },
            opcode::VMAPP => ItsCommand::Vmapp {
                vpeid,
                target,
                valid,
                default_doorbell: doorbell_field(field(p[1], 31, 0)),
            },
            opcode::VMAPTI => ItsCommand::Vmapti {
                device,
                event,
                vpeid,
                vintid: field(p[2], 31, 0) as u32,
                doorbell,
            },
            opcode::VMAPI => ItsCommand::Vmapi {
                device,
                event,
                vpeid,
                doorbell,
            },
            opcode::VMOVI => ItsCommand::Vmovi {
                device,
                event,
                vpeid,
                doorbell,
            },
            opcode::VMOVP => ItsCommand::Vmovp { vpeid, target },
            opcode::VSYNC => ItsCommand::Vsync { vpeid },
            opcode::VINVALL => ItsCommand::Vinvall { vpeid },
            opcode::VSGI => ItsCommand::Vsgi {
                vpeid,
                sgi: field(p[0], 35, 32) as u8,
                priority: (field(p[0], 23, 20) as u8) << 4,
                group: Group::from_bit(p[0] & (1 << 10) != 0),
                enable: p[0] & (1 << 8) != 0,
                clear: p[0] & (1 << 9) != 0,
            },
            op => return Err(ItsError::UnknownCommand(op)),
        })
    }
}

/// What a processed command produced beyond its table updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandOutcome {
    /// Tables updated; nothing to signal.
    Done,
    /// An INT command's interrupt.
    Interrupt(MsiOutcome),
}

impl Its {
    /// An ITS in reset state (disabled, every table empty), sized from
    /// `params`.
    pub fn new(params: &GicParams) -> Self {
        let p = params.its;
        let bits = p.event_bits.clamp(1, 16);
        let devices = p.devices as usize;
        Its {
            cores: params.topology.cores,
            gicv4: params.gicv4,
            gicv4_1: params.gicv4_1,
            lpi_end: params.lpi_end(),
            vlpi_end: LPI_BASE + params.redistributor.vlpis,
            max_event_bits: bits,
            devices: vec![0; devices].into_boxed_slice(),
            ittes: vec![Ite::Unmapped; devices << bits].into_boxed_slice(),
            collections: vec![UNMAPPED; usize::from(p.collections)].into_boxed_slice(),
            vpes: vec![None; usize::from(params.redistributor.vpes)].into_boxed_slice(),
            queue: vec![[0; 4]; p.queue.max(2)].into_boxed_slice(),
            creadr: 0,
            cwriter: 0,
            enabled: false,
            last_error: None,
            counters: ItsCounters::default(),
        }
    }

    /// Event counts so far.
    pub fn counters(&self) -> ItsCounters {
        self.counters
    }

    /// The last command error (what GITS_CREADR.Stalled and the SError
    /// syndrome would report).
    pub fn last_error(&self) -> Option<ItsError> {
        self.last_error
    }

    /// Sets GITS_CTLR.Enabled.
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// GITS_TYPER: Physical, Virtual (GICv4), ITT entry size (8 bytes),
    /// ID_bits, Devbits, CIDbits, VMOVP (single ITS), HCC 0.
    pub fn typer(&self) -> u64 {
        let id_bits = u64::from(u32::BITS - (self.lpi_end.max(LPI_BASE + 1) - 1).leading_zeros());
        let dev_bits =
            u64::from(usize::BITS - self.devices.len().max(2).saturating_sub(1).leading_zeros());
        let cid_bits = u64::from(
            usize::BITS
                - self
                    .collections
                    .len()
                    .max(2)
                    .saturating_sub(1)
                    .leading_zeros(),
        );
        1 | (u64::from(self.gicv4) << 1)
            | (7 << 4)
            | ((id_bits - 1) << 8)
            | ((dev_bits - 1) << 13)
            | (1 << 36)
            | ((cid_bits - 1) << 32)
            | (u64::from(self.gicv4) << 37)
            | (u64::from(self.gicv4_1) * TYPER_VMAPP)
    }

    /// A 64-bit MMIO read of a GITS register.
    pub fn mmio_read(&self, offset: u64) -> Result<u64, GicError> {
        let slot = |i: usize| (i * 32) as u64;
        match offset {
            regs::CTLR => Ok(u64::from(self.enabled) | (1 << 31)),
            regs::TYPER => Ok(self.typer()),
            regs::CWRITER => Ok(slot(self.cwriter)),
            regs::CREADR => Ok(slot(self.creadr)),
            o => Err(GicError::Offset(o)),
        }
    }

    /// A GITS_CTLR write (only Enabled is writable).
    pub fn mmio_write(&mut self, offset: u64, value: u64) -> Result<(), GicError> {
        match offset {
            regs::CTLR if value & !1 == 0 => {
                self.enabled = value & 1 != 0;
                Ok(())
            }
            regs::CTLR => Err(GicError::Reserved {
                reg: "GITS_CTLR",
                value,
            }),
            regs::TYPER | regs::CREADR => Err(GicError::ReadOnly(offset)),
            regs::SGIR => Err(GicError::Offset(offset)),
            o => Err(GicError::Offset(o)),
        }
    }

    /// A GITS_SGIR write (GICv4.1): the vSGI the value names for the vPE it
    /// names, delivered as [`Self::send_vsgi`] does. Bits outside vPEID
    /// \[47:32\] and vINTID \[3:0\] are RES0: a value using them faults.
    pub fn write_sgir(&mut self, value: u64, t: &mut ItsTargets<'_>) -> MsiOutcome {
        const FIELDS: u64 = (0xFFFF << 32) | 0xF;
        if value & !FIELDS != 0 {
            return MsiOutcome::Fault(ItsError::Unsupported("GITS_SGIR RES0 bits set"));
        }
        self.send_vsgi(field(value, 47, 32) as u16, field(value, 3, 0) as u32, t)
    }

    /// The GITS_SGIR value that asks for vSGI `sgi` of `vpeid`.
    pub fn sgir_value(vpeid: u16, sgi: u32) -> u64 {
        (u64::from(vpeid) << 32) | u64::from(sgi & 0xF)
    }

    /// The ITE of (device, event), if the device is mapped and the event is
    /// in its ITT (KVM's `vgic_its_resolve_lpi` reads the same).
    pub fn ite(&self, device: u32, event: u32) -> Result<Ite, ItsError> {
        self.ite_index(device, event).map(|i| self.ittes[i])
    }

    fn ite_index(&self, device: u32, event: u32) -> Result<usize, ItsError> {
        let bits = *self
            .devices
            .get(device as usize)
            .ok_or(ItsError::DeviceOutOfRange(device))?;
        if bits == 0 {
            return Err(ItsError::UnmappedDevice(device));
        }
        if u64::from(event) >= 1u64 << bits {
            return Err(ItsError::EventOutOfRange { device, event });
        }
        Ok(((device as usize) << self.max_event_bits) + event as usize)
    }

    fn mapped_ite(&self, device: u32, event: u32) -> Result<(usize, Ite), ItsError> {
        let i = self.ite_index(device, event)?;
        match self.ittes[i] {
            Ite::Unmapped => Err(ItsError::UnmappedEvent { device, event }),
            ite => Ok((i, ite)),
        }
    }

    /// The core of collection `icid`.
    pub fn collection(&self, icid: u16) -> Result<usize, ItsError> {
        match self.collections.get(usize::from(icid)) {
            None => Err(ItsError::CollectionOutOfRange(icid)),
            Some(&UNMAPPED) => Err(ItsError::UnmappedCollection(icid)),
            Some(&c) => Ok(c),
        }
    }

    /// The vPE table entry of `vpeid`.
    pub fn vpe(&self, vpeid: u16) -> Result<VpeEntry, ItsError> {
        match self.vpes.get(usize::from(vpeid)) {
            None => Err(ItsError::VpeOutOfRange(vpeid)),
            Some(None) => Err(ItsError::UnmappedVpe(vpeid)),
            Some(Some(e)) => Ok(*e),
        }
    }

    fn check_icid(&self, icid: u16) -> Result<(), ItsError> {
        if usize::from(icid) < self.collections.len() {
            Ok(())
        } else {
            Err(ItsError::CollectionOutOfRange(icid))
        }
    }

    fn check_vpeid(&self, vpeid: u16) -> Result<(), ItsError> {
        if !self.gicv4 {
            return Err(ItsError::Unsupported("GICv4 virtual LPIs"));
        }
        if usize::from(vpeid) < self.vpes.len() {
            Ok(())
        } else {
            Err(ItsError::VpeOutOfRange(vpeid))
        }
    }

    fn check_target(&self, core: usize) -> Result<(), ItsError> {
        if core < self.cores {
            Ok(())
        } else {
            Err(ItsError::TargetOutOfRange(core))
        }
    }

    fn check_lpi(&self, intid: u32, end: u32) -> Result<(), ItsError> {
        if (LPI_BASE..end).contains(&intid) {
            Ok(())
        } else {
            Err(ItsError::InvalidLpi(intid))
        }
    }

    fn check_doorbell(&self, d: Option<u32>) -> Result<(), ItsError> {
        d.map_or(Ok(()), |d| self.check_lpi(d, self.lpi_end))
    }

    /// Translates an MSI: the GITS_TRANSLATER write of `event` by device
    /// `device`, and delivers its outcome (see the module doc). Faults are
    /// counted and returned as [`MsiOutcome::Fault`].
    pub fn translate(&mut self, device: u32, event: u32, t: &mut ItsTargets<'_>) -> MsiOutcome {
        self.counters.translations += 1;
        let out = if self.enabled {
            self.deliver(device, event, t)
        } else {
            Err(ItsError::Disabled)
        };
        match out {
            Ok(o) => o,
            Err(e) => {
                self.counters.faults += 1;
                MsiOutcome::Fault(e)
            }
        }
    }

    fn deliver(
        &mut self,
        device: u32,
        event: u32,
        t: &mut ItsTargets<'_>,
    ) -> Result<MsiOutcome, ItsError> {
        let (_, ite) = self.mapped_ite(device, event)?;
        match ite {
            Ite::Unmapped => Err(ItsError::UnmappedEvent { device, event }),
            Ite::Physical { pintid, icid } => {
                let core = self.collection(icid)?;
                let r = t
                    .redists
                    .get_mut(core)
                    .ok_or(ItsError::TargetOutOfRange(core))?;
                let newly_pending = r.set_lpi_pending(pintid)?;
                self.counters.lpis += 1;
                Ok(MsiOutcome::Lpi {
                    core,
                    intid: pintid,
                    newly_pending,
                })
            }
            Ite::Virtual {
                vintid,
                vpeid,
                doorbell,
            } => self.post(vpeid, vintid, doorbell, t),
        }
    }

    /// Sends vINTID `vintid` to `vpeid` where the vPE table says it lives.
    fn post(
        &mut self,
        vpeid: u16,
        vintid: u32,
        ite_doorbell: Option<u32>,
        t: &mut ItsTargets<'_>,
    ) -> Result<MsiOutcome, ItsError> {
        let vpe = self.vpe(vpeid)?;
        let core = vpe.core;
        let r = t
            .redists
            .get_mut(core)
            .ok_or(ItsError::TargetOutOfRange(core))?;
        // GICv4.1 uses the vPE's default doorbell, and only if its last
        // deschedule asked for one (GICR_VPENDBASER.Doorbell; it rings
        // once); GICv4.0 the ITE's, which KVM gates by enabling the
        // doorbell LPI.
        let v41_wanted =
            self.gicv4_1 && r.resident() != Some(vpeid) && t.vlpis.doorbell_wanted(vpeid);
        let doorbell = if self.gicv4_1 {
            vpe.default_doorbell.filter(|_| v41_wanted)
        } else {
            ite_doorbell
        };
        let post = r.post_vlpi(vpeid, vintid, doorbell, t.vlpis)?;
        if let VlpiPost::NotResident {
            doorbell: Some(_), ..
        } = post
        {
            if self.gicv4_1 {
                t.vlpis.set_doorbell_wanted(vpeid, false);
            }
        }
        Ok(match post {
            VlpiPost::Resident { newly_pending } => {
                self.counters.vlpis_resident += 1;
                MsiOutcome::VlpiResident {
                    core,
                    vpeid,
                    vintid,
                    newly_pending,
                }
            }
            VlpiPost::NotResident {
                newly_pending,
                doorbell,
            } => {
                self.counters.vlpis_pending += 1;
                self.counters.doorbells += u64::from(doorbell.is_some());
                MsiOutcome::VlpiPending {
                    core,
                    vpeid,
                    vintid,
                    newly_pending,
                    doorbell,
                }
            }
        })
    }

    /// GICv4.1 vSGI generation (GITS_SGIR): vSGI `sgi` for `vpeid`,
    /// delivered like a vLPI (resident: straight to the vCPU interface;
    /// otherwise pending, with the vPE's default doorbell).
    pub fn send_vsgi(&mut self, vpeid: u16, sgi: u32, t: &mut ItsTargets<'_>) -> MsiOutcome {
        let r = if !self.gicv4_1 {
            Err(ItsError::Unsupported("GICv4.1 vSGIs"))
        } else if sgi >= 16 {
            Err(ItsError::InvalidLpi(sgi))
        } else {
            self.post(vpeid, sgi, None, t)
        };
        r.unwrap_or_else(MsiOutcome::Fault)
    }

    /// Clears the pending state of an ITE wherever it is.
    fn clear_ite(&self, ite: Ite, t: &mut ItsTargets<'_>) -> Result<(), ItsError> {
        match ite {
            Ite::Unmapped => Ok(()),
            Ite::Physical { pintid, icid } => {
                if let Ok(core) = self.collection(icid) {
                    if let Some(r) = t.redists.get_mut(core) {
                        r.clear_lpi_pending(pintid)?;
                    }
                }
                Ok(())
            }
            Ite::Virtual { vintid, vpeid, .. } => {
                t.vlpis.clear_pending(vpeid, vintid)?;
                Ok(())
            }
        }
    }

    /// Executes one command now. An error leaves the tables unchanged and
    /// is counted.
    pub fn command(
        &mut self,
        cmd: ItsCommand,
        t: &mut ItsTargets<'_>,
    ) -> Result<CommandOutcome, ItsError> {
        let r = self.execute(cmd, t);
        match r {
            Ok(_) => self.counters.commands += 1,
            Err(e) => {
                self.counters.command_errors += 1;
                self.last_error = Some(e);
            }
        }
        r
    }

    fn execute(
        &mut self,
        cmd: ItsCommand,
        t: &mut ItsTargets<'_>,
    ) -> Result<CommandOutcome, ItsError> {
        use ItsCommand::*;
        match cmd {
            Mapd {
                device,
                size,
                valid,
            } => {
                let d = device as usize;
                if d >= self.devices.len() {
                    return Err(ItsError::DeviceOutOfRange(device));
                }
                let bits = size.saturating_add(1);
                if valid && bits > self.max_event_bits {
                    return Err(ItsError::IttTooLarge(bits));
                }
                // A new (or no) ITT: every old ITE is gone.
                let base = d << self.max_event_bits;
                self.ittes[base..base + (1 << self.max_event_bits)].fill(Ite::Unmapped);
                self.devices[d] = if valid { bits } else { 0 };
            }
            Mapc {
                icid,
                target,
                valid,
            } => {
                self.check_icid(icid)?;
                if valid {
                    self.check_target(target)?;
                }
                self.collections[usize::from(icid)] = if valid { target } else { UNMAPPED };
            }
            Mapti {
                device,
                event,
                pintid,
                icid,
            } => {
                let i = self.ite_index(device, event)?;
                self.check_lpi(pintid, self.lpi_end)?;
                self.check_icid(icid)?;
                self.ittes[i] = Ite::Physical { pintid, icid };
            }
            Mapi {
                device,
                event,
                icid,
            } => {
                return self.execute(
                    Mapti {
                        device,
                        event,
                        pintid: event,
                        icid,
                    },
                    t,
                )
            }
            Movi {
                device,
                event,
                icid,
            } => {
                let (i, ite) = self.mapped_ite(device, event)?;
                let Ite::Physical { pintid, icid: old } = ite else {
                    return Err(ItsError::WrongIteKind { device, event });
                };
                let to = self.collection(icid)?;
                if let Ok(from) = self.collection(old) {
                    if let Some((a, b)) = two_mut(t.redists, from, to) {
                        a.move_lpi(pintid, b)?;
                    }
                }
                self.ittes[i] = Ite::Physical { pintid, icid };
            }
            Inv { device, event } => {
                let (_, ite) = self.mapped_ite(device, event)?;
                // vLPI configuration is read live: nothing cached to drop.
                if let Ite::Physical { pintid, icid } = ite {
                    let core = self.collection(icid)?;
                    if let Some(r) = t.redists.get_mut(core) {
                        r.invalidate_lpi(pintid, t.lpi_config)?;
                    }
                }
            }
            Invall { icid } => {
                let core = self.collection(icid)?;
                if let Some(r) = t.redists.get_mut(core) {
                    r.invalidate_all(t.lpi_config);
                }
            }
            Discard { device, event } => {
                let (i, ite) = self.mapped_ite(device, event)?;
                self.clear_ite(ite, t)?;
                self.ittes[i] = Ite::Unmapped;
            }
            Int { device, event } => {
                return Ok(CommandOutcome::Interrupt(self.deliver(device, event, t)?));
            }
            Clear { device, event } => {
                let (_, ite) = self.mapped_ite(device, event)?;
                self.clear_ite(ite, t)?;
            }
            Sync { target } => self.check_target(target)?,
            Movall { from, to } => {
                self.check_target(from)?;
                self.check_target(to)?;
                if let Some((a, b)) = two_mut(t.redists, from, to) {
                    a.move_all_lpis(b);
                }
            }
            Vmapp {
                vpeid,
                target,
                valid,
                default_doorbell,
            } => {
                self.check_vpeid(vpeid)?;
                let entry = if valid {
                    self.check_target(target)?;
                    let db = if self.gicv4_1 { default_doorbell } else { None };
                    self.check_doorbell(db)?;
                    Some(VpeEntry {
                        core: target,
                        default_doorbell: db,
                    })
                } else {
                    None
                };
                self.vpes[usize::from(vpeid)] = entry;
            }
            Vmapti {
                device,
                event,
                vpeid,
                vintid,
                doorbell,
            } => {
                self.check_vpeid(vpeid)?;
                let i = self.ite_index(device, event)?;
                self.check_lpi(vintid, self.vlpi_end)?;
                self.check_doorbell(doorbell)?;
                self.ittes[i] = Ite::Virtual {
                    vintid,
                    vpeid,
                    doorbell,
                };
            }
            Vmapi {
                device,
                event,
                vpeid,
                doorbell,
            } => {
                return self.execute(
                    Vmapti {
                        device,
                        event,
                        vpeid,
                        vintid: event,
                        doorbell,
                    },
                    t,
                )
            }
            Vmovi {
                device,
                event,
                vpeid,
                doorbell,
            } => {
                self.check_vpeid(vpeid)?;
                self.check_doorbell(doorbell)?;
                let (i, ite) = self.mapped_ite(device, event)?;
                let Ite::Virtual {
                    vintid, vpeid: old, ..
                } = ite
                else {
                    return Err(ItsError::WrongIteKind { device, event });
                };
                if t.vlpis.clear_pending(old, vintid)? {
                    t.vlpis.set_pending(vpeid, vintid)?;
                }
                self.ittes[i] = Ite::Virtual {
                    vintid,
                    vpeid,
                    doorbell,
                };
            }
            Vmovp { vpeid, target } => {
                self.check_vpeid(vpeid)?;
                self.check_target(target)?;
                let mut e = self.vpe(vpeid)?;
                e.core = target;
                self.vpes[usize::from(vpeid)] = Some(e);
            }
            Vsync { vpeid } | Vinvall { vpeid } => {
                self.check_vpeid(vpeid)?;
                self.vpe(vpeid)?;
            }
            Vsgi {
                vpeid,
                sgi,
                priority,
                group,
                enable,
                clear,
            } => {
                if !self.gicv4_1 {
                    return Err(ItsError::Unsupported("GICv4.1 VSGI"));
                }
                self.vpe(vpeid)?;
                t.vlpis
                    .configure_vsgi(vpeid, u32::from(sgi), priority, group, enable, clear)?;
            }
        }
        Ok(CommandOutcome::Done)
    }

    /// Writes a command packet at GITS_CWRITER and advances it.
    pub fn submit(&mut self, packet: [u64; 4]) -> Result<(), ItsError> {
        let next = (self.cwriter + 1) % self.queue.len();
        if next == self.creadr {
            return Err(ItsError::QueueFull);
        }
        self.queue[self.cwriter] = packet;
        self.cwriter = next;
        Ok(())
    }

    /// Commands queued and not processed yet.
    pub fn queued(&self) -> usize {
        (self.cwriter + self.queue.len() - self.creadr) % self.queue.len()
    }

    /// Processes the queue up to GITS_CWRITER, advancing GITS_CREADR.
    /// Malformed or failing commands are counted and skipped; interrupts
    /// from INT commands go to `on_interrupt`. Returns how many commands
    /// were read.
    pub fn process(
        &mut self,
        t: &mut ItsTargets<'_>,
        mut on_interrupt: impl FnMut(MsiOutcome),
    ) -> usize {
        let mut n = 0;
        while self.creadr != self.cwriter {
            let packet = self.queue[self.creadr];
            self.creadr = (self.creadr + 1) % self.queue.len();
            n += 1;
            let cmd = match ItsCommand::decode(packet) {
                Ok(c) => c,
                Err(e) => {
                    self.counters.command_errors += 1;
                    self.last_error = Some(e);
                    continue;
                }
            };
            if let Ok(CommandOutcome::Interrupt(o)) = self.command(cmd, t) {
                on_interrupt(o);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::arm::cpu_interface::CpuInterface;
    use crate::hw::arm::distributor::Distributor;
    use crate::hw::arm::intid::SPURIOUS;

    /// A whole GIC around the ITS: 4 cores, GICv4 with 8 vPEs, LPIs enabled
    /// everywhere, the ITS enabled.
    struct Rig {
        its: Its,
        redists: Vec<Redistributor>,
        config: LpiConfigTable,
        vlpis: VlpiTables,
        dist: Distributor,
        cpus: Vec<CpuInterface>,
    }

    impl Rig {
        fn new(params: GicParams) -> Self {
            let mut config = LpiConfigTable::new(params.redistributor.lpis);
            for i in 0..64 {
                config.set(LPI_BASE + i, 0xA0, true).unwrap();
            }
            let mut redists: Vec<_> = (0..params.topology.cores)
                .map(|c| Redistributor::new(c, &params))
                .collect();
            for r in &mut redists {
                r.set_lpis_enabled(true, &config);
            }
            let mut its = Its::new(&params);
            its.set_enabled(true);
            Rig {
                its,
                redists,
                config,
                vlpis: VlpiTables::for_params(&params),
                dist: Distributor::new(&params),
                cpus: (0..params.topology.cores)
                    .map(|c| CpuInterface::new(c, &params).linux_host(false))
                    .collect(),
            }
        }

        fn cmd(&mut self, c: ItsCommand) -> Result<CommandOutcome, ItsError> {
            let mut t = ItsTargets {
                redists: &mut self.redists,
                lpi_config: &self.config,
                vlpis: &mut self.vlpis,
            };
            self.its.command(c, &mut t)
        }

        fn msi(&mut self, device: u32, event: u32) -> MsiOutcome {
            let mut t = ItsTargets {
                redists: &mut self.redists,
                lpi_config: &self.config,
                vlpis: &mut self.vlpis,
            };
            self.its.translate(device, event, &mut t)
        }

        fn ack(&mut self, core: usize) -> u32 {
            let i = self.cpus[core].read_iar1(&mut self.dist, &mut self.redists[core]);
            if i != SPURIOUS {
                self.cpus[core]
                    .write_eoir1(i, &mut self.dist, &mut self.redists[core])
                    .unwrap();
            }
            i
        }
    }

    fn v4() -> GicParams {
        GicParams::gicv4(4, 8)
    }

    /// The kvm-unit-tests arm/gic.c `its-trigger` setup: device 2 with an
    /// ITT, collection 3 on core 3, event 20 -> LPI 8195.
    fn trigger_rig() -> Rig {
        let mut r = Rig::new(v4());
        r.cmd(ItsCommand::Mapd {
            device: 2,
            size: 7,
            valid: true,
        })
        .unwrap();
        r.cmd(ItsCommand::Mapc {
            icid: 3,
            target: 3,
            valid: true,
        })
        .unwrap();
        r.cmd(ItsCommand::Mapti {
            device: 2,
            event: 20,
            pintid: 8195,
            icid: 3,
        })
        .unwrap();
        r
    }

    /// `its-trigger`: MAPD/MAPC/MAPTI then an MSI delivers the LPI to the
    /// collection's core; with the LPI disabled (and INV) it does not; after
    /// DISCARD it does not; INV picks up configuration changes.
    #[test]
    fn its_trigger() {
        let mut r = trigger_rig();
        assert_eq!(
            r.msi(2, 20),
            MsiOutcome::Lpi {
                core: 3,
                intid: 8195,
                newly_pending: true
            }
        );
        assert_eq!(r.ack(2), SPURIOUS);
        assert_eq!(r.ack(3), 8195);
        // INT does the same.
        assert_eq!(
            r.cmd(ItsCommand::Int {
                device: 2,
                event: 20
            }),
            Ok(CommandOutcome::Interrupt(MsiOutcome::Lpi {
                core: 3,
                intid: 8195,
                newly_pending: true
            }))
        );
        assert_eq!(r.ack(3), 8195);

        // Disable the LPI in memory: without INV the cached config still
        // delivers; after INV it does not.
        r.config.set(8195, 0xA0, false).unwrap();
        r.msi(2, 20);
        assert_eq!(r.ack(3), 8195, "stale cache until INV");
        r.cmd(ItsCommand::Inv {
            device: 2,
            event: 20,
        })
        .unwrap();
        r.msi(2, 20);
        assert_eq!(r.ack(3), SPURIOUS, "disabled LPI is not delivered");
        assert!(r.redists[3].lpi_pending(8195), "but it stays pending");
        // Re-enable at another priority: INV makes it deliverable again.
        r.config.set(8195, 0x20, true).unwrap();
        r.cmd(ItsCommand::Inv {
            device: 2,
            event: 20,
        })
        .unwrap();
        assert_eq!(r.redists[3].lpi_config(8195), Some((0x20, true)));
        assert_eq!(r.ack(3), 8195);

        // DISCARD: the event is unmapped; an MSI now faults.
        r.msi(2, 20);
        r.cmd(ItsCommand::Discard {
            device: 2,
            event: 20,
        })
        .unwrap();
        assert!(!r.redists[3].lpi_pending(8195), "DISCARD clears pending");
        assert_eq!(
            r.msi(2, 20),
            MsiOutcome::Fault(ItsError::UnmappedEvent {
                device: 2,
                event: 20
            })
        );
        assert_eq!(r.ack(3), SPURIOUS);
        assert_eq!(r.its.counters().faults, 1);
    }

    #[test]
    fn invall_picks_up_every_change() {
        let mut r = trigger_rig();
        r.config.set(8195, 0xA0, false).unwrap();
        r.cmd(ItsCommand::Invall { icid: 3 }).unwrap();
        r.msi(2, 20);
        assert_eq!(r.ack(3), SPURIOUS);
    }

    /// `its-migration`: MOVI moves delivery (and any pending state) to the
    /// new collection's core.
    #[test]
    fn its_migration_movi() {
        let mut r = trigger_rig();
        r.cmd(ItsCommand::Mapc {
            icid: 1,
            target: 1,
            valid: true,
        })
        .unwrap();
        // Pending at core 3 (masked there), then moved with the event.
        r.cpus[3].write_pmr(0);
        r.msi(2, 20);
        r.cmd(ItsCommand::Movi {
            device: 2,
            event: 20,
            icid: 1,
        })
        .unwrap();
        assert!(!r.redists[3].lpi_pending(8195) && r.redists[1].lpi_pending(8195));
        assert_eq!(r.ack(1), 8195);
        assert!(matches!(r.msi(2, 20), MsiOutcome::Lpi { core: 1, .. }));
        // MOVI to an unmapped collection is an error and changes nothing.
        assert_eq!(
            r.cmd(ItsCommand::Movi {
                device: 2,
                event: 20,
                icid: 9
            }),
            Err(ItsError::UnmappedCollection(9))
        );
        assert_eq!(
            r.its.ite(2, 20),
            Ok(Ite::Physical {
                pintid: 8195,
                icid: 1
            })
        );
        // MOVALL moves what is pending from one core to another.
        r.cpus[1].write_pmr(0);
        r.msi(2, 20);
        r.cmd(ItsCommand::Movall { from: 1, to: 2 }).unwrap();
        assert!(r.redists[2].lpi_pending(8195));
    }

    fn vlpi_rig(params: GicParams) -> Rig {
        let mut r = Rig::new(params);
        r.cmd(ItsCommand::Mapd {
            device: 5,
            size: 3,
            valid: true,
        })
        .unwrap();
        r.cmd(ItsCommand::Vmapp {
            vpeid: 4,
            target: 1,
            valid: true,
            default_doorbell: Some(8250),
        })
        .unwrap();
        r.cmd(ItsCommand::Vmapti {
            device: 5,
            event: 0,
            vpeid: 4,
            vintid: 8300,
            doorbell: Some(8200),
        })
        .unwrap();
        r.vlpis.set_config(4, 8300, 0x40, true).unwrap();
        r
    }

    /// GICv4: a vLPI for a resident vPE is delivered with no doorbell; for
    /// a non-resident one it stays pending and rings the doorbell, and is
    /// delivered once the vPE is made resident.
    #[test]
    fn vlpi_resident_vs_doorbell() {
        let mut r = vlpi_rig(v4());
        // Not resident: pending + doorbell LPI 8200 at core 1.
        match r.msi(5, 0) {
            MsiOutcome::VlpiPending {
                core,
                vpeid,
                vintid,
                doorbell,
                ..
            } => {
                assert_eq!((core, vpeid, vintid), (1, 4, 8300));
                assert_eq!(
                    doorbell,
                    Some(Doorbell {
                        intid: 8200,
                        signalled: true
                    })
                );
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(r.ack(1), 8200, "the host takes the doorbell");
        assert!(r.vlpis.is_pending(4, 8300));
        // Scheduled in: what waited is visible to the vCPU interface.
        assert_eq!(r.redists[1].make_resident(4, &mut r.vlpis), Ok(true));
        assert_eq!(
            r.redists[1]
                .direct_vlpis(&mut r.vlpis)
                .unwrap()
                .best()
                .map(|c| c.intid),
            Some(8300)
        );
        // A new vLPI while resident: delivered, no doorbell.
        r.vlpis.clear_pending(4, 8300).unwrap();
        assert_eq!(
            r.msi(5, 0),
            MsiOutcome::VlpiResident {
                core: 1,
                vpeid: 4,
                vintid: 8300,
                newly_pending: true
            }
        );
        assert!(!r.redists[1].lpi_pending(8200));
        assert_eq!(r.its.counters().doorbells, 1);
    }

    /// GICv4.1 uses the vPE's default doorbell, not the ITE's.
    #[test]
    fn v41_default_doorbell() {
        let mut r = vlpi_rig(GicParams::gicv4_1(4, 8));
        match r.msi(5, 0) {
            MsiOutcome::VlpiPending { doorbell, .. } => {
                assert_eq!(doorbell.map(|d| d.intid), Some(8250))
            }
            o => panic!("{o:?}"),
        }
    }

    /// `its-migration` for vPEs: VMOVP moves where the vPE's vLPIs go;
    /// VMOVI moves an event (and its pending bit) to another vPE.
    #[test]
    fn vmovp_and_vmovi() {
        let mut r = vlpi_rig(v4());
        r.cmd(ItsCommand::Vmovp {
            vpeid: 4,
            target: 2,
        })
        .unwrap();
        r.redists[2].make_resident(4, &mut r.vlpis).unwrap();
        assert!(matches!(
            r.msi(5, 0),
            MsiOutcome::VlpiResident { core: 2, .. }
        ));
        r.cmd(ItsCommand::Vmapp {
            vpeid: 6,
            target: 3,
            valid: true,
            default_doorbell: None,
        })
        .unwrap();
        r.cmd(ItsCommand::Vmovi {
            device: 5,
            event: 0,
            vpeid: 6,
            doorbell: None,
        })
        .unwrap();
        assert!(!r.vlpis.is_pending(4, 8300) && r.vlpis.is_pending(6, 8300));
        match r.msi(5, 0) {
            MsiOutcome::VlpiPending {
                core: 3,
                vpeid: 6,
                doorbell: None,
                ..
            } => {}
            o => panic!("{o:?}"),
        }
        // VMOVI on a physical ITE is refused.
        r.cmd(ItsCommand::Mapc {
            icid: 0,
            target: 0,
            valid: true,
        })
        .unwrap();
        r.cmd(ItsCommand::Mapti {
            device: 5,
            event: 1,
            pintid: 8192,
            icid: 0,
        })
        .unwrap();
        assert_eq!(
            r.cmd(ItsCommand::Vmovi {
                device: 5,
                event: 1,
                vpeid: 6,
                doorbell: None
            }),
            Err(ItsError::WrongIteKind {
                device: 5,
                event: 1
            })
        );
    }

    #[test]
    fn vsgi_is_a_v41_feature() {
        let mut r = vlpi_rig(v4());
        let vsgi = ItsCommand::Vsgi {
            vpeid: 4,
            sgi: 3,
            priority: 0x50,
            group: Group::G1,
            enable: true,
            clear: false,
        };
        assert!(matches!(r.cmd(vsgi), Err(ItsError::Unsupported(_))));
        let mut r = vlpi_rig(GicParams::gicv4_1(4, 8));
        r.cmd(vsgi).unwrap();
        let mut t = ItsTargets {
            redists: &mut r.redists,
            lpi_config: &r.config,
            vlpis: &mut r.vlpis,
        };
        match r.its.send_vsgi(4, 3, &mut t) {
            MsiOutcome::VlpiPending {
                vintid: 3,
                doorbell,
                ..
            } => {
                assert_eq!(doorbell.map(|d| d.intid), Some(8250))
            }
            o => panic!("{o:?}"),
        }
        r.redists[1].make_resident(4, &mut r.vlpis).unwrap();
        let d = r.redists[1].direct_vlpis(&mut r.vlpis).unwrap();
        assert_eq!(d.best().map(|c| (c.intid, c.priority)), Some((3, 0x50)));
    }

    /// GICv4.1 vSGIs through GITS_SGIR (what KVM's vgic_v3_queue_sgi does
    /// for an SGI with `irq->hw`): a resident vPE gets it with no doorbell;
    /// a vPE descheduled with GICR_VPENDBASER.Doorbell gets its default
    /// doorbell once; one descheduled without (a preempted vCPU) none.
    #[test]
    fn gits_sgir_delivers_a_vsgi_or_rings_the_v41_doorbell_once() {
        let mut r = vlpi_rig(GicParams::gicv4_1(4, 8));
        assert_ne!(r.its.typer() & TYPER_VMAPP, 0, "a GICv4.1 ITS says so");
        assert_eq!(Its::new(&v4()).typer() & TYPER_VMAPP, 0);
        r.cmd(ItsCommand::Vsgi {
            vpeid: 4,
            sgi: 1,
            priority: 0xA0,
            group: Group::G1,
            enable: true,
            clear: false,
        })
        .unwrap();
        let sgir = |r: &mut Rig, v: u64| {
            let mut t = ItsTargets {
                redists: &mut r.redists,
                lpi_config: &r.config,
                vlpis: &mut r.vlpis,
            };
            r.its.write_sgir(v, &mut t)
        };
        r.redists[1].make_resident(4, &mut r.vlpis).unwrap();
        assert!(matches!(
            sgir(&mut r, Its::sgir_value(4, 1)),
            MsiOutcome::VlpiResident {
                core: 1,
                vintid: 1,
                ..
            }
        ));
        let mut d = r.redists[1].direct_vlpis(&mut r.vlpis).unwrap();
        assert!(d.acknowledge(1));
        // Blocked in WFI: Doorbell = 1 at the deschedule.
        r.redists[1].make_non_resident(&mut r.vlpis, true).unwrap();
        match sgir(&mut r, Its::sgir_value(4, 1)) {
            MsiOutcome::VlpiPending { doorbell, .. } => {
                assert_eq!(doorbell.map(|d| d.intid), Some(8250))
            }
            o => panic!("{o:?}"),
        }
        r.redists[1].clear_lpi_pending(8250).unwrap();
        assert!(
            matches!(
                sgir(&mut r, Its::sgir_value(4, 1)),
                MsiOutcome::VlpiPending { doorbell: None, .. }
            ),
            "the v4.1 doorbell rings once per deschedule"
        );
        // Preempted: Doorbell = 0.
        r.redists[1].make_resident(4, &mut r.vlpis).unwrap();
        r.redists[1].make_non_resident(&mut r.vlpis, false).unwrap();
        assert!(matches!(
            sgir(&mut r, Its::sgir_value(4, 1)),
            MsiOutcome::VlpiPending { doorbell: None, .. }
        ));
        assert!(matches!(
            sgir(&mut r, 1 << 20),
            MsiOutcome::Fault(ItsError::Unsupported(_))
        ));
        let mut r4 = vlpi_rig(v4());
        assert!(matches!(
            sgir(&mut r4, Its::sgir_value(4, 1)),
            MsiOutcome::Fault(ItsError::Unsupported(_))
        ));
    }

    #[test]
    fn translation_faults_are_counted_never_panics() {
        let mut r = trigger_rig();
        let faults = [
            (99, 0, ItsError::DeviceOutOfRange(99)),
            (7, 0, ItsError::UnmappedDevice(7)),
            (
                2,
                256,
                ItsError::EventOutOfRange {
                    device: 2,
                    event: 256,
                },
            ),
            (
                2,
                21,
                ItsError::UnmappedEvent {
                    device: 2,
                    event: 21,
                },
            ),
        ];
        for (d, e, want) in faults {
            assert_eq!(r.msi(d, e), MsiOutcome::Fault(want));
        }
        // An ITE whose collection is unmapped.
        r.cmd(ItsCommand::Mapti {
            device: 2,
            event: 21,
            pintid: 8196,
            icid: 7,
        })
        .unwrap();
        assert_eq!(
            r.msi(2, 21),
            MsiOutcome::Fault(ItsError::UnmappedCollection(7))
        );
        // A disabled ITS translates nothing.
        r.its.set_enabled(false);
        assert_eq!(r.msi(2, 20), MsiOutcome::Fault(ItsError::Disabled));
        // LPIs disabled at the target.
        r.its.set_enabled(true);
        let cfg = r.config.clone();
        r.redists[3].set_lpis_enabled(false, &cfg);
        assert_eq!(
            r.msi(2, 20),
            MsiOutcome::Fault(ItsError::Redistributor(GicErrorKind::LpisDisabled))
        );
        assert_eq!(r.its.counters().faults, 7);
        assert_eq!(r.its.counters().translations, 7);
    }

    #[test]
    fn malformed_and_invalid_commands_are_errors() {
        let mut r = Rig::new(GicParams::gicv3(2));
        let bad = [
            (
                ItsCommand::Mapd {
                    device: 64,
                    size: 0,
                    valid: true,
                },
                ItsError::DeviceOutOfRange(64),
            ),
            (
                ItsCommand::Mapd {
                    device: 1,
                    size: 8,
                    valid: true,
                },
                ItsError::IttTooLarge(9),
            ),
            (
                ItsCommand::Mapc {
                    icid: 64,
                    target: 0,
                    valid: true,
                },
                ItsError::CollectionOutOfRange(64),
            ),
            (
                ItsCommand::Mapc {
                    icid: 0,
                    target: 2,
                    valid: true,
                },
                ItsError::TargetOutOfRange(2),
            ),
            (
                ItsCommand::Vmapp {
                    vpeid: 0,
                    target: 0,
                    valid: true,
                    default_doorbell: None,
                },
                ItsError::Unsupported("GICv4 virtual LPIs"),
            ),
            (
                ItsCommand::Invall { icid: 0 },
                ItsError::UnmappedCollection(0),
            ),
        ];
        for (c, e) in bad {
            assert_eq!(r.cmd(c), Err(e));
        }
        r.cmd(ItsCommand::Mapd {
            device: 1,
            size: 3,
            valid: true,
        })
        .unwrap();
        assert_eq!(
            r.cmd(ItsCommand::Mapti {
                device: 1,
                event: 0,
                pintid: 100,
                icid: 0
            }),
            Err(ItsError::InvalidLpi(100))
        );
        assert_eq!(
            r.cmd(ItsCommand::Mapi {
                device: 1,
                event: 3,
                icid: 0
            }),
            Err(ItsError::InvalidLpi(3)),
            "MAPI uses the EventID as the LPI"
        );
        assert_eq!(
            ItsCommand::decode([0x7F, 0, 0, 0]),
            Err(ItsError::UnknownCommand(0x7F))
        );
        assert_eq!(r.its.counters().command_errors, 8);
        assert_eq!(r.its.last_error(), Some(ItsError::InvalidLpi(3)));
    }

    #[test]
    fn packets_round_trip() {
        let cmds = [
            ItsCommand::Mapd {
                device: 0xABCD,
                size: 7,
                valid: true,
            },
            ItsCommand::Mapc {
                icid: 12,
                target: 3,
                valid: true,
            },
            ItsCommand::Mapti {
                device: 2,
                event: 20,
                pintid: 8195,
                icid: 3,
            },
            ItsCommand::Mapi {
                device: 2,
                event: 8200,
                icid: 3,
            },
            ItsCommand::Movi {
                device: 2,
                event: 20,
                icid: 1,
            },
            ItsCommand::Inv {
                device: 1,
                event: 2,
            },
            ItsCommand::Invall { icid: 4 },
            ItsCommand::Discard {
                device: 1,
                event: 2,
            },
            ItsCommand::Int {
                device: 1,
                event: 2,
            },
            ItsCommand::Clear {
                device: 1,
                event: 2,
            },
            ItsCommand::Sync { target: 3 },
            ItsCommand::Movall { from: 1, to: 2 },
            ItsCommand::Vmapp {
                vpeid: 9,
                target: 2,
                valid: true,
                default_doorbell: Some(8300),
            },
            ItsCommand::Vmapti {
                device: 3,
                event: 4,
                vpeid: 9,
                vintid: 8500,
                doorbell: None,
            },
            ItsCommand::Vmapi {
                device: 3,
                event: 4,
                vpeid: 9,
                doorbell: Some(8201),
            },
            ItsCommand::Vmovi {
                device: 3,
                event: 4,
                vpeid: 10,
                doorbell: None,
            },
            ItsCommand::Vmovp {
                vpeid: 9,
                target: 1,
            },
            ItsCommand::Vsync { vpeid: 9 },
            ItsCommand::Vinvall { vpeid: 9 },
            ItsCommand::Vsgi {
                vpeid: 9,
                sgi: 5,
                priority: 0xA0,
                group: Group::G1,
                enable: true,
                clear: false,
            },
        ];
        for c in cmds {
            assert_eq!(ItsCommand::decode(c.encode()), Ok(c), "{c:?}");
        }
        let p = ItsCommand::Mapti {
            device: 2,
            event: 20,
            pintid: 8195,
            icid: 3,
        }
        .encode();
        assert_eq!(p[0], 0x0A | (2 << 32));
        assert_eq!(p[1], 20 | (8195 << 32));
        assert_eq!(p[2], 3);
    }

    #[test]
    fn command_queue_ring() {
        let mut p = v4();
        p.its.queue = 4;
        let mut r = Rig::new(p);
        let cmds = [
            ItsCommand::Mapd {
                device: 2,
                size: 7,
                valid: true,
            },
            ItsCommand::Mapc {
                icid: 3,
                target: 3,
                valid: true,
            },
            ItsCommand::Mapti {
                device: 2,
                event: 20,
                pintid: 8195,
                icid: 3,
            },
        ];
        for c in cmds {
            r.its.submit(c.encode()).unwrap();
        }
        assert_eq!(
            r.its.submit([0; 4]),
            Err(ItsError::QueueFull),
            "one slot stays free"
        );
        assert_eq!(r.its.queued(), 3);
        assert_eq!(r.its.mmio_read(regs::CWRITER), Ok(96));
        let mut got = Vec::new();
        let mut t = ItsTargets {
            redists: &mut r.redists,
            lpi_config: &r.config,
            vlpis: &mut r.vlpis,
        };
        assert_eq!(r.its.process(&mut t, |o| got.push(o)), 3);
        // A malformed packet, then an INT: the bad one is skipped.
        r.its.submit([0x7F, 0, 0, 0]).unwrap();
        r.its
            .submit(
                ItsCommand::Int {
                    device: 2,
                    event: 20,
                }
                .encode(),
            )
            .unwrap();
        assert_eq!(r.its.process(&mut t, |o| got.push(o)), 2);
        assert_eq!(
            got,
            vec![MsiOutcome::Lpi {
                core: 3,
                intid: 8195,
                newly_pending: true
            }]
        );
        assert_eq!(r.its.counters().command_errors, 1);
        assert_eq!(
            r.its.mmio_read(regs::CREADR),
            r.its.mmio_read(regs::CWRITER)
        );
        assert_eq!(r.its.mmio_read(regs::TYPER).map(|t| t & 3), Ok(3));
    }
}
