//! What travels on links and bridges and sits in device buffers: a frame's
//! length and the header fields the model acts on. Payload bytes are never
//! modelled.

use crate::engine::Time;

/// Ethernet (14) + IPv4 (20) + UDP (8).
pub const UDP_HEADERS: u32 = 42;
/// Ethernet (14) + IPv4 (20) + ICMP echo header (8).
pub const ICMP_HEADERS: u32 = 42;
/// IPv4 (20) + TCP with timestamps (32): a TCP packet's headers above
/// Ethernet, what a GSO or GRO packet's IP datagram adds to its payload.
pub const IP_TCP_HEADERS: u32 = 52;
/// Ethernet (14) + IPv4 (20) + TCP with timestamps (32).
pub const TCP_HEADERS: u32 = 14 + IP_TCP_HEADERS;

/// The TCP header fields the endpoint model uses. Sequence numbers are
/// 64-bit: a simulated run never wraps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpSegment {
    /// First sequence number of the payload.
    pub seq: u64,
    /// Payload bytes (0 for a pure ACK).
    pub len: u32,
    /// Cumulative acknowledgement: next byte expected.
    pub ack: u64,
    /// Advertised receive window, bytes.
    pub wnd: u32,
    /// PSH flag.
    pub psh: bool,
    /// SYN flag: a connection request (SYN) or its answer (SYN-ACK). It
    /// carries the SYN options ([`SYN_OPTIONS_EXTRA`]) and, in this model,
    /// no sequence space (see `guest::tcp`).
    pub syn: bool,
    /// FIN flag: the sender has no more data. It takes one sequence
    /// number after the data (RFC 793), acknowledged by `ack = seq + len + 1`.
    pub fin: bool,
}

/// What a SYN or SYN-ACK's options add to a segment's timestamps option
/// (12 bytes, in [`TCP_HEADERS`]): Linux sends MSS (4), SACK-permitted
/// (2), timestamps (10), NOP (1) and window scale (3), 20 bytes, so the
/// header is 8 bytes longer (`tcp_syn_options`, `tcp_synack_options`).
pub const SYN_OPTIONS_EXTRA: u32 = 8;

/// The transport header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A UDP datagram (`seq` numbers datagrams for loss accounting).
    Udp {
        /// Payload bytes.
        len: u32,
        /// Sender's datagram counter.
        seq: u64,
    },
    /// A TCP segment.
    Tcp(TcpSegment),
    /// An ICMP echo request or reply (ping). The identifier is the flow.
    Icmp {
        /// Echo request (type 8) or reply (type 0).
        request: bool,
        /// Payload bytes (ping's `-s`, timestamp included).
        len: u32,
        /// Sequence number.
        seq: u64,
    },
}

impl Default for Transport {
    fn default() -> Self {
        Transport::Udp { len: 0, seq: 0 }
    }
}

/// Largest GSO packet (Linux `GSO_MAX_SIZE`, 64 KiB): the IP datagram of
/// a TSO/GSO or GRO packet stays below it.
pub const GSO_MAX_SIZE: u32 = 65_536;

/// One Ethernet frame, or one GSO packet: a TCP segment longer than its
/// `gso_size` that stands for the train of `gso_size` frames the sender's
/// NIC (TSO) or stack (GSO) cuts it into, as an skb with
/// `skb_shinfo(skb)->gso_size` does in Linux. GRO builds the same packet on
/// the receive side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Connection (the 5-tuple's stand-in): which socket it belongs to.
    pub flow: u16,
    /// Transport header.
    pub transport: Transport,
    /// When the sending host's stack handed it to its device.
    pub sent: Time,
    /// Payload bytes per wire frame of a GSO packet; 0 for a plain frame.
    pub gso_size: u16,
}

/// The model's IPv4 addressing: every VM (or native host) the peers talk
/// to is `SERVER_IP`, every peer host `CLIENT_IP`, and a guest's service
/// listens on `SERVER_PORT` (named simplification: one address pair, as
/// on the papers' two-host testbeds).
pub const SERVER_IP: [u8; 4] = [10, 0, 0, 1];
/// The peer (client) host's address.
pub const CLIENT_IP: [u8; 4] = [10, 0, 0, 2];
/// The guest service's port.
pub const SERVER_PORT: u16 = 80;
/// The first port of Linux's ephemeral range (`ip_local_port_range`,
/// 32768–61000 by default): flow f's client end is port
/// `EPHEMERAL_LOW + f`.
pub const EPHEMERAL_LOW: u16 = 32768;

/// A frame's IPv4 4-tuple as seen arriving at the server: source
/// (client) address and port, destination (server) address and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    /// Source address.
    pub src_ip: [u8; 4],
    /// Destination address.
    pub dst_ip: [u8; 4],
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl Frame {
    /// A TCP frame.
    pub fn tcp(flow: u16, seg: TcpSegment, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Tcp(seg),
            sent,
            gso_size: 0,
        }
    }

    /// A TCP segment from a sender whose MSS is `mss`: a GSO packet when
    /// it carries more than one MSS.
    pub fn tcp_gso(flow: u16, seg: TcpSegment, mss: u32, sent: Time) -> Self {
        let gso_size = if seg.len > mss {
            u16::try_from(mss).unwrap_or(u16::MAX)
        } else {
            0
        };
        Frame {
            gso_size,
            ..Frame::tcp(flow, seg, sent)
        }
    }

    /// A UDP frame of `len` payload bytes.
    pub fn udp(flow: u16, len: u32, seq: u64, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Udp { len, seq },
            sent,
            gso_size: 0,
        }
    }

    /// An ICMP echo request (`request`) or reply of `len` payload bytes.
    pub fn icmp(flow: u16, request: bool, len: u32, seq: u64, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Icmp { request, len, seq },
            sent,
            gso_size: 0,
        }
    }

    /// Wire frames it stands for: 1, or a GSO packet's segment count.
    pub fn gso_segs(&self) -> u32 {
        match self.transport {
            Transport::Tcp(s) if self.gso_size > 0 => s.len.div_ceil(u32::from(self.gso_size)),
            _ => 1,
        }
    }

    /// Wire frame `k` of [`gso_segs`](Self::gso_segs), as TSO or GSO cut
    /// it (`tcp_gso_segment`): consecutive sequence ranges of `gso_size`
    /// bytes, the last one shorter; each carries the packet's ACK and
    /// window, and only the last keeps PSH.
    pub fn gso_segment(&self, k: u32) -> Frame {
        let Transport::Tcp(s) = self.transport else {
            return *self;
        };
        if self.gso_size == 0 {
            return *self;
        }
        let size = u32::from(self.gso_size);
        let off = k * size;
        let len = size.min(s.len.saturating_sub(off));
        let last = off + len >= s.len;
        Frame {
            transport: Transport::Tcp(TcpSegment {
                seq: s.seq + u64::from(off),
                len,
                psh: s.psh && last,
                ..s
            }),
            gso_size: 0,
            ..*self
        }
    }

    /// The frame's 4-tuple towards the server. A flow is one connection
    /// slot whose successive connections the model runs on one TCP
    /// endpoint at each end, so its tuple is fixed: client port
    /// `EPHEMERAL_LOW + flow` (named simplification: a real client takes
    /// a new ephemeral port per `connect`; docs/vcanal.md, "VM size").
    pub fn tuple(&self) -> Tuple {
        self.tuple_from(EPHEMERAL_LOW)
    }

    /// [`Frame::tuple`] with flow f's client port at `port_base + f`.
    pub fn tuple_from(&self, port_base: u16) -> Tuple {
        Tuple {
            src_ip: CLIENT_IP,
            dst_ip: SERVER_IP,
            src_port: port_base.wrapping_add(self.flow),
            dst_port: SERVER_PORT,
        }
    }

    /// Bytes on the wire, headers included, FCS excluded. A GSO packet
    /// counts its headers once (the skb's length); the wire carries
    /// [`gso_segs`](Self::gso_segs) frames of their own headers.
    pub fn len(&self) -> u32 {
        match self.transport {
            Transport::Udp { len, .. } => len + UDP_HEADERS,
            Transport::Tcp(s) if s.syn => s.len + TCP_HEADERS + SYN_OPTIONS_EXTRA,
            Transport::Tcp(s) => s.len + TCP_HEADERS,
            Transport::Icmp { len, .. } => len + ICMP_HEADERS,
        }
    }

    /// Whether the frame carries no transport payload.
    pub fn is_empty(&self) -> bool {
        match self.transport {
            Transport::Udp { len, .. } => len == 0,
            Transport::Tcp(s) => s.len == 0,
            Transport::Icmp { len, .. } => len == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_include_headers() {
        let f = Frame::tcp(
            1,
            TcpSegment {
                len: 1448,
                ..Default::default()
            },
            0,
        );
        assert_eq!(f.len(), 1514);
        assert!(!f.is_empty());
        let ack = Frame::tcp(1, TcpSegment::default(), 0);
        assert_eq!(ack.len(), 66);
        assert!(ack.is_empty());
        // A plain segment is not a GSO packet, whatever the MSS.
        assert_eq!(
            Frame::tcp_gso(
                1,
                TcpSegment {
                    len: 1448,
                    ..Default::default()
                },
                1448,
                0
            )
            .gso_segs(),
            1
        );
        // ping's default 56 bytes: the 98-byte frame tcpdump shows.
        assert_eq!(Frame::icmp(1, true, 56, 0, 0).len(), 98);
    }

    /// TSO/GSO cuts a packet into MSS frames covering its sequence range
    /// once, in order; ACK and window are copied, PSH only on the last.
    #[test]
    fn gso_packets_cut_into_mss_frames() {
        let seg = TcpSegment {
            seq: 1000,
            len: 3 * 1448 + 100,
            ack: 77,
            wnd: 5000,
            psh: true,
            syn: false,
            fin: false,
        };
        let p = Frame::tcp_gso(4, seg, 1448, 9);
        assert_eq!(p.gso_size, 1448);
        assert_eq!(p.gso_segs(), 4);
        let mut next = 1000;
        for k in 0..4 {
            let f = p.gso_segment(k);
            let Transport::Tcp(s) = f.transport else {
                panic!("not TCP")
            };
            assert_eq!(s.seq, next);
            assert_eq!((s.ack, s.wnd, f.flow, f.sent), (77, 5000, 4, 9));
            assert_eq!(s.psh, k == 3);
            assert_eq!(f.gso_size, 0);
            assert_eq!(s.len, if k == 3 { 100 } else { 1448 });
            next += u64::from(s.len);
        }
        assert_eq!(next, 1000 + u64::from(seg.len));
        // Non-TCP frames are never GSO packets.
        let u = Frame::udp(1, 1400, 0, 0);
        assert_eq!((u.gso_segs(), u.gso_segment(0)), (1, u));
    }
}
