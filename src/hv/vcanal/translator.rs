//! The request translator's address/port hash (vcanal.md §2.3): guests keep
//! their own network settings and may all bind the same ports, so a
//! guest's (VM, IP, port) is given a host port by hashing, with linear
//! probing on collision; replies arriving at that host port map back to
//! the guest address. For TCP this runs once, at bind time.
//!
//! The table is indexed by host port over a fixed range, allocated once;
//! a lookup from the guest side probes from the key's hash, from the host
//! side it is one index. Released ports become tombstones (a bound port
//! must never move), cleared when the run they end in reaches an empty
//! slot. The key is the exact (VM, IP, port): a guest binding the wildcard
//! and a specific IP on the same port gets two host ports (Linux would
//! refuse the second bind; the paper's hash keys on IP and port alike).

use crate::guest::libcanal::inr::{Errno, SockAddr};

/// A guest's socket address, qualified by its VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuestAddr {
    /// The VM.
    pub vm: usize,
    /// The guest's own IPv4 address and port.
    pub addr: SockAddr,
}

/// The host port range the translator hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TranslatorParams {
    /// First host port.
    pub first_port: u16,
    /// How many ports from `first_port` (at most `65536 - first_port`).
    pub ports: u32,
    /// Probes one bind or lookup may make before giving up.
    pub max_probes: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Empty,
    Tombstone,
    Bound(GuestAddr),
}

/// Guest (VM, IP, port) ↔ host port.
#[derive(Clone, Debug)]
pub struct Translator {
    params: TranslatorParams,
    table: Vec<Entry>,
    /// Ports bound now.
    pub bound: u32,
    /// Probes past the first slot (collisions) so far.
    pub collisions: u64,
}

/// FNV-1a over the key's bytes, then MurmurHash3's 64-bit finaliser (FNV's
/// low bits, which pick the slot, are a linear function of the input's
/// low bits): deterministic on every machine.
fn hash(g: &GuestAddr) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = (g.vm as u64).to_le_bytes();
    let ip = g.addr.ip.to_le_bytes();
    let port = g.addr.port.to_le_bytes();
    for b in bytes.iter().chain(&ip).chain(&port) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl Translator {
    /// An empty table over the host ports `params` names (clamped to the
    /// 16-bit port space).
    pub fn new(params: TranslatorParams) -> Self {
        let max = 65536 - params.first_port as u32;
        let params = TranslatorParams {
            ports: params.ports.clamp(1, max),
            max_probes: params.max_probes.max(1),
            ..params
        };
        Self {
            table: vec![Entry::Empty; params.ports as usize],
            params,
            bound: 0,
            collisions: 0,
        }
    }

    fn n(&self) -> usize {
        self.table.len()
    }

    /// The table slots `g`'s probe sequence visits, in order.
    fn probes(&self, g: &GuestAddr) -> impl Iterator<Item = usize> {
        let n = self.n();
        let start = (hash(g) % n as u64) as usize;
        let k = (self.params.max_probes as usize).min(n);
        (0..k).map(move |i| (start + i) % n)
    }

    /// The slot holding `g`, if bound.
    fn find(&self, g: &GuestAddr) -> Option<usize> {
        for i in self.probes(g) {
            match self.table[i] {
                Entry::Bound(x) if x == *g => return Some(i),
                Entry::Empty => return None,
                _ => {}
            }
        }
        None
    }

    fn port_of(&self, slot: usize) -> u16 {
        self.params.first_port + slot as u16
    }

    /// Binds `g` to a host port. Port 0 asks for any port: the guest's
    /// port then equals the host port chosen. EADDRINUSE if `g` is bound
    /// already; EADDRNOTAVAIL if no free port lies within the probe limit.
    pub fn bind(&mut self, g: GuestAddr) -> Result<u16, Errno> {
        if g.addr.port == 0 {
            return self.bind_any(g);
        }
        let mut free = None;
        for (k, i) in self.probes(&g).enumerate() {
            match self.table[i] {
                Entry::Bound(x) if x == g => return Err(Errno::Eaddrinuse),
                Entry::Bound(_) => {}
                Entry::Tombstone => {
                    free.get_or_insert((k, i));
                }
                Entry::Empty => {
                    free.get_or_insert((k, i));
                    break;
                }
            }
        }
        let (k, i) = free.ok_or(Errno::Eaddrnotavail)?;
        self.table[i] = Entry::Bound(g);
        self.bound += 1;
        self.collisions += k as u64;
        Ok(self.port_of(i))
    }

    /// An ephemeral bind: the first free slot from `g`'s hash whose port,
    /// taken as the guest's port too, is not bound by that guest address.
    fn bind_any(&mut self, g: GuestAddr) -> Result<u16, Errno> {
        for (k, i) in self.probes(&g).enumerate() {
            if matches!(self.table[i], Entry::Bound(_)) {
                continue;
            }
            let mut me = g;
            me.addr.port = self.port_of(i);
            if me.addr.port == 0 || self.find(&me).is_some() {
                continue;
            }
            self.table[i] = Entry::Bound(me);
            self.bound += 1;
            self.collisions += k as u64;
            return Ok(me.addr.port);
        }
        Err(Errno::Eaddrnotavail)
    }

    /// The host port `g` is bound to.
    pub fn host_port(&self, g: &GuestAddr) -> Option<u16> {
        self.find(g).map(|i| self.port_of(i))
    }

    /// The guest address a packet to `host_port` belongs to (replies map
    /// back).
    pub fn guest_of(&self, host_port: u16) -> Option<GuestAddr> {
        let i = host_port.checked_sub(self.params.first_port)? as usize;
        match self.table.get(i)? {
            Entry::Bound(g) => Some(*g),
            _ => None,
        }
    }

    /// Frees `host_port`, returning whom it was bound to.
    pub fn release(&mut self, host_port: u16) -> Option<GuestAddr> {
        let g = self.guest_of(host_port)?;
        let n = self.n();
        let mut i = (host_port - self.params.first_port) as usize;
        self.table[i] = Entry::Tombstone;
        self.bound -= 1;
        // A tombstone followed by an empty slot ends no probe run.
        for _ in 0..n {
            if self.table[i] != Entry::Tombstone || self.table[(i + 1) % n] != Entry::Empty {
                break;
            }
            self.table[i] = Entry::Empty;
            i = (i + n - 1) % n;
        }
        Some(g)
    }

    /// Bytes of table storage (constant).
    pub fn allocated(&self) -> usize {
        self.table.capacity() * std::mem::size_of::<Entry>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(vm: usize, ip: u32, port: u16) -> GuestAddr {
        GuestAddr {
            vm,
            addr: SockAddr { ip, port },
        }
    }

    fn params(ports: u32) -> TranslatorParams {
        TranslatorParams {
            first_port: 20000,
            ports,
            max_probes: ports,
        }
    }

    #[test]
    fn two_vms_binding_the_same_port_get_different_host_ports_and_map_back() {
        let mut t = Translator::new(params(1024));
        // Both guests think they are 10.0.0.2:80.
        let a = g(0, 0x0a00_0002, 80);
        let b = g(1, 0x0a00_0002, 80);
        let pa = t.bind(a).unwrap();
        let pb = t.bind(b).unwrap();
        assert_ne!(pa, pb);
        assert!((20000..21024).contains(&pa) && (20000..21024).contains(&pb));
        assert_eq!(t.guest_of(pa), Some(a));
        assert_eq!(t.guest_of(pb), Some(b));
        assert_eq!(t.host_port(&a), Some(pa));
        assert_eq!(t.host_port(&b), Some(pb));
        // The same guest address twice is in use.
        assert_eq!(t.bind(a), Err(Errno::Eaddrinuse));
        assert_eq!(t.guest_of(19999), None);
        assert_eq!(t.guest_of(21024), None);
    }

    #[test]
    fn collisions_probe_on_and_a_full_range_refuses() {
        let mut t = Translator::new(params(4));
        let ports: Vec<u16> = (0..4).map(|vm| t.bind(g(vm, 1, 80)).unwrap()).collect();
        let mut sorted = ports.clone();
        sorted.sort();
        assert_eq!(sorted, vec![20000, 20001, 20002, 20003]);
        assert_eq!(t.bind(g(9, 1, 80)), Err(Errno::Eaddrnotavail));
        // Release one: its port is reusable, the others still resolve.
        assert_eq!(t.release(ports[2]), Some(g(2, 1, 80)));
        assert_eq!(t.release(ports[2]), None);
        let p = t.bind(g(9, 1, 80)).unwrap();
        assert_eq!(p, ports[2]);
        for vm in [0, 1, 3] {
            assert_eq!(t.host_port(&g(vm, 1, 80)), Some(ports[vm]));
        }
        // 64 keys in 64 ports cannot all hash to distinct homes (odds
        // 64!/64^64): some probe past theirs, and all still get a port.
        let mut t = Translator::new(params(64));
        let mut seen: Vec<u16> = (0..64).map(|vm| t.bind(g(vm, 9, 443)).unwrap()).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 64);
        assert!(t.collisions > 0);
    }

    #[test]
    fn ephemeral_binds_take_distinct_ports() {
        let mut t = Translator::new(params(64));
        let a = t.bind(g(0, 7, 0)).unwrap();
        let b = t.bind(g(0, 7, 0)).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.guest_of(a), Some(g(0, 7, a)));
        assert_eq!(t.bound, 2);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Bind(usize, u16),
        Release(usize),
    }

    proptest! {
        /// Against a model map: binds succeed iff the key is new and a port
        /// is free, every bound key resolves both ways, ports are unique.
        #[test]
        fn agrees_with_a_model(ops in proptest::collection::vec(prop_oneof![
            (0usize..3, 1u16..6).prop_map(|(v, p)| Op::Bind(v, p)),
            (0usize..16).prop_map(Op::Release),
        ], 1..200)) {
            let mut t = Translator::new(params(8));
            let mut model: Vec<(GuestAddr, u16)> = Vec::new();
            for o in ops {
                match o {
                    Op::Bind(vm, port) => {
                        let k = g(vm, 1, port);
                        let r = t.bind(k);
                        if model.iter().any(|(x, _)| *x == k) {
                            prop_assert_eq!(r, Err(Errno::Eaddrinuse));
                        } else if model.len() == 8 {
                            prop_assert_eq!(r, Err(Errno::Eaddrnotavail));
                        } else {
                            let p = r.unwrap();
                            prop_assert!(model.iter().all(|(_, q)| *q != p));
                            model.push((k, p));
                        }
                    }
                    Op::Release(i) => {
                        if i < model.len() {
                            let (k, p) = model.remove(i);
                            prop_assert_eq!(t.release(p), Some(k));
                        }
                    }
                }
                for (k, p) in &model {
                    prop_assert_eq!(t.host_port(k), Some(*p));
                    prop_assert_eq!(t.guest_of(*p), Some(*k));
                }
                prop_assert_eq!(t.bound as usize, model.len());
            }
        }
    }
}
