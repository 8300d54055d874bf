//! The interrupt descriptor table as the CPU uses it in guest mode. The
//! guest installs its own IDT; a hypervisor may point the guest's IDTR at a
//! shadow copy it keeps in guest memory (ELI). Delivering a vector whose gate
//! is not present raises #NP instead of running a handler, and the exception
//! bitmap decides whether #NP exits.

use super::lapic::ApicBitmap;

/// #NP (segment not present): delivery through a gate whose present bit is
/// clear.
pub const NP_VECTOR: u8 = 11;

/// Which table the guest-state IDTR in the VMCS points at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Idtr {
    /// The guest's own IDT: every vector runs the guest's handler for it.
    #[default]
    Guest,
    /// The vCPU's shadow IDT ([`ShadowIdt`]).
    Shadow,
}

/// A shadow IDT: for each vector, the guest handler its gate was copied
/// from, or not present.
#[derive(Clone, Debug)]
pub struct ShadowIdt {
    /// `gate[v]` = the guest vector whose handler vector `v` runs.
    gate: [Option<u8>; 256],
}

impl Default for ShadowIdt {
    fn default() -> Self {
        ShadowIdt::copy_of_guest()
    }
}

impl ShadowIdt {
    /// A verbatim copy of the guest's IDT (every gate present, each vector
    /// runs its own handler).
    pub fn copy_of_guest() -> Self {
        let mut gate = [None; 256];
        for (v, g) in gate.iter_mut().enumerate() {
            *g = Some(v as u8);
        }
        ShadowIdt { gate }
    }

    /// Clears the present bit of `vector`'s gate.
    pub fn mark_not_present(&mut self, vector: u8) {
        self.gate[vector as usize] = None;
    }

    /// Copies the guest's gate for `guest_vector` into slot `vector`,
    /// present.
    pub fn copy_gate(&mut self, vector: u8, guest_vector: u8) {
        self.gate[vector as usize] = Some(guest_vector);
    }

    /// The guest handler `vector` runs, or None (#NP).
    pub fn gate(&self, vector: u8) -> Option<u8> {
        self.gate[vector as usize]
    }

    /// The guest's view of a physical in-service set: each present vector
    /// as the guest vector its handler serves.
    pub fn guest_view(&self, isr: &ApicBitmap) -> ApicBitmap {
        let mut out = ApicBitmap::default();
        for v in isr.iter() {
            if let Some(g) = self.gate(v) {
                out.set(g);
            }
        }
        out
    }
}

/// The gate a vector is delivered through under `idtr`.
pub fn gate(idtr: Idtr, shadow: &ShadowIdt, vector: u8) -> Option<u8> {
    match idtr {
        Idtr::Guest => Some(vector),
        Idtr::Shadow => shadow.gate(vector),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_idt_runs_every_vector_as_itself() {
        let s = ShadowIdt::default();
        for v in [0u8, 0x20, 0x41, 0xEF, 0xFF] {
            assert_eq!(gate(Idtr::Guest, &s, v), Some(v));
        }
    }

    #[test]
    fn shadow_gates_remap_and_fault() {
        let mut s = ShadowIdt::copy_of_guest();
        s.mark_not_present(0xEF);
        s.copy_gate(0x61, 0x41);
        assert_eq!(gate(Idtr::Shadow, &s, 0xEF), None);
        assert_eq!(gate(Idtr::Shadow, &s, 0x61), Some(0x41));
        // The guest's own IDT is unaffected by the shadow copy.
        assert_eq!(gate(Idtr::Guest, &s, 0xEF), Some(0xEF));
        let mut isr = ApicBitmap::default();
        isr.set(0x61);
        isr.set(0xEF);
        let view = s.guest_view(&isr);
        assert!(view.test(0x41));
        assert!(!view.test(0x61));
        assert!(!view.test(0xEF));
    }
}
