//! What travels on links and bridges and sits in device buffers: a frame's
//! length and the header fields the model acts on. Payload bytes are never
//! modelled.

use crate::engine::Time;

/// Ethernet (14) + IPv4 (20) + UDP (8).
pub const UDP_HEADERS: u32 = 42;
/// Ethernet (14) + IPv4 (20) + ICMP echo header (8).
pub const ICMP_HEADERS: u32 = 42;
/// Ethernet (14) + IPv4 (20) + TCP with timestamps (32).
pub const TCP_HEADERS: u32 = 66;

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
}

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

/// One Ethernet frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Connection (the 5-tuple's stand-in): which socket it belongs to.
    pub flow: u16,
    /// Transport header.
    pub transport: Transport,
    /// When the sending host's stack handed it to its device.
    pub sent: Time,
}

impl Frame {
    /// A TCP frame.
    pub fn tcp(flow: u16, seg: TcpSegment, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Tcp(seg),
            sent,
        }
    }

    /// A UDP frame of `len` payload bytes.
    pub fn udp(flow: u16, len: u32, seq: u64, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Udp { len, seq },
            sent,
        }
    }

    /// An ICMP echo request (`request`) or reply of `len` payload bytes.
    pub fn icmp(flow: u16, request: bool, len: u32, seq: u64, sent: Time) -> Self {
        Frame {
            flow,
            transport: Transport::Icmp { request, len, seq },
            sent,
        }
    }

    /// Bytes on the wire, headers included, FCS excluded.
    pub fn len(&self) -> u32 {
        match self.transport {
            Transport::Udp { len, .. } => len + UDP_HEADERS,
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
        // ping's default 56 bytes: the 98-byte frame tcpdump shows.
        assert_eq!(Frame::icmp(1, true, 56, 0, 0).len(), 98);
    }
}
