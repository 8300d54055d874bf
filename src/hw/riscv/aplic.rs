//! The Advanced Platform-Level Interrupt Controller (AIA v1.0 §4) for
//! wired interrupts, in MSI delivery mode: a hierarchy of interrupt
//! domains (the root, M-level, delegates sources to its S-level child
//! through `sourcecfg.D`); a domain whose `domaincfg.DM` = 1 turns a
//! pending, enabled source into an MSI to the IMSIC file its `target`
//! names (hart index, guest index, EIID), then clears the pending bit.
//!
//! KVM emulates a guest's APLIC in software (arch/riscv/kvm/aia_aplic.c)
//! and forwards its MSIs into the guest's IMSIC; the host's own APLIC is
//! this block.

/// `domaincfg.IE` (bit 8): the domain delivers.
pub const DOMAINCFG_IE: u32 = 1 << 8;
/// `domaincfg.DM` (bit 2): MSI delivery mode.
pub const DOMAINCFG_DM: u32 = 1 << 2;
/// `sourcecfg.D` (bit 10): delegated to a child domain.
pub const SOURCECFG_D: u32 = 1 << 10;

/// A source's mode (`sourcecfg.SM`, §4.5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceMode {
    /// Inactive (0): the source is not implemented in this domain.
    Inactive,
    /// Detached (1): only `setip` writes make it pending.
    Detached,
    /// Edge1 (4): a rising edge.
    EdgeRise,
    /// Edge0 (5): a falling edge.
    EdgeFall,
    /// Level1 (6): high.
    LevelHigh,
    /// Level0 (7): low.
    LevelLow,
}

impl SourceMode {
    /// The mode of `sm`, the field's value; reserved values are Inactive.
    pub fn from_bits(sm: u32) -> Self {
        match sm & 7 {
            1 => SourceMode::Detached,
            4 => SourceMode::EdgeRise,
            5 => SourceMode::EdgeFall,
            6 => SourceMode::LevelHigh,
            7 => SourceMode::LevelLow,
            _ => SourceMode::Inactive,
        }
    }

    /// The rectified input for a wire at `level`.
    fn rectify(self, level: bool) -> bool {
        match self {
            SourceMode::EdgeRise | SourceMode::LevelHigh => level,
            SourceMode::EdgeFall | SourceMode::LevelLow => !level,
            _ => false,
        }
    }
}

/// An MSI a domain sends (its `target[i]` in MSI mode, §4.5.16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AplicMsi {
    /// Hart index.
    pub hart: usize,
    /// Guest index (0: the S file).
    pub guest: usize,
    /// External interrupt identity.
    pub eiid: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Source {
    cfg: u32,
    target: u32,
    pending: bool,
    enabled: bool,
    rectified: bool,
}

/// One interrupt domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    domaincfg: u32,
    sources: Vec<Source>,
}

impl Domain {
    fn new(sources: usize) -> Self {
        Domain {
            domaincfg: 0,
            sources: vec![Source::default(); sources + 1],
        }
    }

    fn mode(&self, i: usize) -> SourceMode {
        let cfg = self.sources[i].cfg;
        if cfg & SOURCECFG_D != 0 {
            SourceMode::Inactive
        } else {
            SourceMode::from_bits(cfg)
        }
    }

    /// The MSI source `i` sends now, if it is pending and enabled and the
    /// domain delivers by MSI; the pending bit clears as it is sent
    /// (§4.9.3).
    fn forward(&mut self, i: usize) -> Option<AplicMsi> {
        let on = self.domaincfg & (DOMAINCFG_IE | DOMAINCFG_DM) == DOMAINCFG_IE | DOMAINCFG_DM;
        let s = &mut self.sources[i];
        if !(on && s.pending && s.enabled) {
            return None;
        }
        s.pending = false;
        Some(AplicMsi {
            hart: (s.target >> 18) as usize,
            guest: (s.target >> 12 & 0x3F) as usize,
            eiid: s.target & 0x7FF,
        })
    }
}

/// An APLIC: the root domain (index 0) and its S-level child (index 1),
/// `sources` wired sources numbered 1..=sources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aplic {
    domains: [Domain; 2],
}

impl Aplic {
    /// An APLIC with `sources` sources, every domain reset (no delivery).
    pub fn new(sources: usize) -> Self {
        Aplic {
            domains: [Domain::new(sources), Domain::new(sources)],
        }
    }

    fn valid(&self, i: usize) -> bool {
        (1..self.domains[0].sources.len()).contains(&i)
    }

    /// Writes domain `d`'s `domaincfg` (IE and DM only; BE stays 0).
    pub fn write_domaincfg(&mut self, d: usize, value: u32) {
        if let Some(dom) = self.domains.get_mut(d) {
            dom.domaincfg = value & (DOMAINCFG_IE | DOMAINCFG_DM);
        }
    }

    /// Writes `sourcecfg[i]` of domain `d`. The root may delegate (D = 1,
    /// child index 0); the child cannot (it has no child). A source the
    /// parent has not delegated is inactive in the child (§4.5.2:
    /// its `sourcecfg` reads zero).
    pub fn write_sourcecfg(&mut self, d: usize, i: usize, value: u32) {
        if !self.valid(i) || d > 1 {
            return;
        }
        if d == 1 && self.domains[0].sources[i].cfg & SOURCECFG_D == 0 {
            return;
        }
        let v = if d == 1 {
            value & 7
        } else {
            value & (SOURCECFG_D | 7)
        };
        self.domains[d].sources[i].cfg = v;
        if v & SOURCECFG_D != 0 {
            // Delegation makes the source inactive here (§4.5.2).
            self.domains[d].sources[i] = Source {
                cfg: v,
                ..Source::default()
            };
        }
    }

    /// Writes `target[i]` of domain `d` in MSI mode.
    pub fn write_target(&mut self, d: usize, i: usize, msi: AplicMsi) {
        if self.valid(i) && d <= 1 {
            self.domains[d].sources[i].target = ((msi.hart as u32 & 0x3FFF) << 18)
                | ((msi.guest as u32 & 0x3F) << 12)
                | (msi.eiid & 0x7FF);
        }
    }

    /// `setienum`/`clrienum` of domain `d`.
    pub fn set_enabled(&mut self, d: usize, i: usize, on: bool) {
        if self.valid(i) && d <= 1 && self.domains[d].mode(i) != SourceMode::Inactive {
            self.domains[d].sources[i].enabled = on;
        }
    }

    /// The domain that handles source `i` (the child if delegated).
    fn owner(&self, i: usize) -> usize {
        usize::from(self.domains[0].sources[i].cfg & SOURCECFG_D != 0)
    }

    /// Wired source `i`'s input changes to `level`: an edge or a level of
    /// the source's mode sets its pending bit in the domain that owns it;
    /// the MSI that domain sends, if any.
    pub fn set_line(&mut self, i: usize, level: bool) -> Option<AplicMsi> {
        if !self.valid(i) {
            return None;
        }
        let d = self.owner(i);
        let mode = self.domains[d].mode(i);
        let dom = &mut self.domains[d];
        let r = mode.rectify(level);
        let was = std::mem::replace(&mut dom.sources[i].rectified, r);
        match mode {
            SourceMode::EdgeRise | SourceMode::EdgeFall if r && !was => {
                dom.sources[i].pending = true
            }
            SourceMode::LevelHigh | SourceMode::LevelLow if r => dom.sources[i].pending = true,
            _ => {}
        }
        dom.forward(i)
    }

    /// A `setipnum` write of `i` to domain `d` (a detached source, or
    /// software re-triggering one); the MSI sent, if any. A level source
    /// is set only while its rectified input is high (§4.7).
    pub fn setipnum(&mut self, d: usize, i: usize) -> Option<AplicMsi> {
        if !self.valid(i) || d > 1 || self.owner(i) != d {
            return None;
        }
        let mode = self.domains[d].mode(i);
        let s = &mut self.domains[d].sources[i];
        match mode {
            SourceMode::Inactive => return None,
            SourceMode::LevelHigh | SourceMode::LevelLow if !s.rectified => return None,
            _ => s.pending = true,
        }
        self.domains[d].forward(i)
    }

    /// Source `i`'s pending bit in domain `d`.
    pub fn pending(&self, d: usize, i: usize) -> bool {
        self.valid(i) && d <= 1 && self.domains[d].sources[i].pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msi_aplic() -> Aplic {
        let mut a = Aplic::new(8);
        a.write_domaincfg(0, DOMAINCFG_IE | DOMAINCFG_DM);
        a.write_domaincfg(1, DOMAINCFG_IE | DOMAINCFG_DM);
        a
    }

    #[test]
    fn a_delegated_edge_source_becomes_one_msi_to_its_target_file() {
        let mut a = msi_aplic();
        a.write_sourcecfg(0, 3, SOURCECFG_D);
        a.write_sourcecfg(1, 3, 4); // Edge1
        let to = AplicMsi {
            hart: 2,
            guest: 1,
            eiid: 33,
        };
        a.write_target(1, 3, to);
        a.set_enabled(1, 3, true);
        assert_eq!(a.set_line(3, true), Some(to));
        assert!(!a.pending(1, 3), "sent, so no longer pending");
        assert_eq!(a.set_line(3, true), None, "no new edge");
        assert_eq!(a.set_line(3, false), None);
        assert_eq!(a.set_line(3, true), Some(to));
    }

    #[test]
    fn an_undelegated_source_is_inactive_in_the_child() {
        let mut a = msi_aplic();
        a.write_sourcecfg(1, 2, 6);
        a.set_enabled(1, 2, true);
        assert_eq!(a.set_line(2, true), None);
        assert!(!a.pending(1, 2));
    }

    #[test]
    fn without_msi_mode_or_ie_a_source_stays_pending() {
        let mut a = Aplic::new(4);
        a.write_sourcecfg(0, 1, 6);
        a.set_enabled(0, 1, true);
        assert_eq!(a.set_line(1, true), None);
        assert!(a.pending(0, 1));
        a.write_domaincfg(0, DOMAINCFG_IE | DOMAINCFG_DM);
        // A level source still high re-sends when software asks.
        assert!(a.setipnum(0, 1).is_some());
        assert_eq!(a.set_line(1, false), None);
        assert_eq!(a.setipnum(0, 1), None, "level low: setip ignored");
    }
}
