//! The guest's interrupt vectors: what each interrupt source it sets up is
//! assigned, checked before the run.

use super::BuildError;

/// Lowest vector an interrupt may use: 0x00-0x1F are the architecture's
/// exceptions and reserved vectors (SDM Vol. 3A §6.2).
const FIRST_INTERRUPT_VECTOR: u8 = 0x20;

/// The guest LAPIC's spurious-interrupt vector: the SVR's reset value,
/// which Linux keeps (SPURIOUS_APIC_VECTOR); a device on it would be
/// taken for a spurious interrupt.
const SPURIOUS_VECTOR: u8 = 0xFF;

/// Checks the vectors the guest assigns, each named by the scenario key
/// that sets it (or by the device whose vector is fixed): each must be an
/// interrupt vector other than the spurious one, and no two may be equal.
/// The guest tells its interrupt sources apart only by vector; two on one
/// vector run one handler for both, and the other source is never served.
///
/// The host's own vectors (its timer, IPIs, the device vectors it hands
/// out) are not the guest's: every scheme delivers by guest vector (KVM
/// injects it, posted interrupts post it, ELI's shadow IDT gives the host
/// vector the guest's gate, DID remaps to it), so they do not constrain
/// this list.
pub(super) fn check_guest_vectors(assigned: &[(&str, u8)]) -> Result<(), BuildError> {
    for (i, &(who, v)) in assigned.iter().enumerate() {
        if !(FIRST_INTERRUPT_VECTOR..SPURIOUS_VECTOR).contains(&v) {
            return Err(BuildError::Scenario(format!(
                "{who} = {v:#x}: a guest interrupt vector must be in 0x20..=0xfe \
                 (0x00-0x1f are exceptions, 0xff is the LAPIC's spurious vector)"
            )));
        }
        if let Some(&(other, _)) = assigned[..i].iter().find(|a| a.1 == v) {
            return Err(BuildError::Scenario(format!(
                "{who} = {v:#x} is also {other}'s vector: every vector the guest \
                 assigns must be distinct"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(a: &[(&str, u8)]) -> String {
        check_guest_vectors(a).unwrap_err().to_string()
    }

    #[test]
    fn distinct_vectors_in_range_pass() {
        assert!(check_guest_vectors(&[("a", 0x20), ("b", 0xEF), ("c", 0xFE)]).is_ok());
        assert!(check_guest_vectors(&[]).is_ok());
    }

    #[test]
    fn a_shared_vector_names_both_owners() {
        let e = err(&[("guest.timer_vector", 0xEF), ("x", 0x41), ("y", 0xEF)]);
        assert!(
            e.contains("y = 0xef") && e.contains("guest.timer_vector"),
            "{e}"
        );
    }

    #[test]
    fn exceptions_and_the_spurious_vector_are_refused() {
        for v in [0x00, 0x1F, 0xFF] {
            let e = err(&[("guest.vf_vector", v)]);
            assert!(
                e.contains("guest.vf_vector") && e.contains("0x20..=0xfe"),
                "{e}"
            );
        }
    }
}
