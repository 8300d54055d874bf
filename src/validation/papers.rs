//! The papers `exitless reproduce` knows: one registry that the command
//! line's help, its error for an unknown name and the README's table all
//! read, so a name is accepted only if it is here (never a path).

/// A paper `reproduce` runs: its name (the directory under `validation/`
/// holding `experiments.toml`), what it is, and its document in docs/.
#[derive(Clone, Copy, Debug)]
pub struct Paper {
    /// `exitless reproduce NAME`.
    pub name: &'static str,
    /// The system and its publication.
    pub what: &'static str,
    /// Where the project describes it.
    pub doc: &'static str,
}

/// Every paper, in the order the README's table lists them.
pub const PAPERS: &[Paper] = &[
    Paper {
        name: "did",
        what: "DID: Direct Interrupt Delivery (Tu et al., VEE '15)",
        doc: "docs/papers.md",
    },
    Paper {
        name: "eli",
        what: "ELI: Exitless Interrupts (Gordon et al., ASPLOS '12)",
        doc: "docs/papers.md",
    },
    Paper {
        name: "es2",
        what: "ES2: efficient and scalable I/O (Hu et al.)",
        doc: "docs/papers.md",
    },
    Paper {
        name: "vcanal",
        what: "vCanal: paravirtual socket offload (Lee et al., IEICE 2016)",
        doc: "docs/vcanal.md",
    },
    Paper {
        name: "did-arm",
        what: "DID on KVM/ARM (a proposal; GICv3/v4)",
        doc: "docs/did-arm.md",
    },
    Paper {
        name: "directvisor",
        what: "the DID authors' public KVM code beside KVM, APICv and kvm-2026",
        doc: "docs/papers.md",
    },
    Paper {
        name: "x86-today",
        what: "KVM on Intel today: kvm, apicv, kvm-2026 (± IPIv, ± APIC-timer virtualization), DID; vmexit micro-benchmarks (no paper)",
        doc: "docs/x86-today.md",
    },
    Paper {
        name: "riscv",
        what: "RISC-V with the AIA: KVM RISC-V (guest file, software file, SBI timer, PLIC) and DID on RISC-V beside x86 KVM and KVM/ARM (no paper)",
        doc: "docs/riscv.md",
    },
    Paper {
        name: "consolidation",
        what: "1 to 8 four-vCPU VMs on four cores under each scheme (no paper)",
        doc: "docs/multiplexing.md",
    },
];

/// The registry's names.
pub fn paper_names() -> impl Iterator<Item = &'static str> {
    PAPERS.iter().map(|p| p.name)
}

/// The paper called `name`, if the registry has it.
pub fn paper(name: &str) -> Option<&'static Paper> {
    PAPERS.iter().find(|p| p.name == name)
}

/// Whether `reproduce` takes `name`: a registered paper, or, with
/// `$EXITLESS_VALIDATION` pointing at a validation root of the user's own,
/// a plain name (letters, digits, `-`, `_`; never a path) of one of its
/// directories that holds an `experiments.toml`.
pub fn known_paper(name: &str) -> bool {
    if paper(name).is_some() {
        return true;
    }
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plain
        && std::env::var_os("EXITLESS_VALIDATION").is_some()
        && super::validation_root()
            .join(name)
            .join("experiments.toml")
            .is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_exactly_the_validation_directories_with_experiments() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("validation");
        let mut dirs: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("experiments.toml").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        let mut names: Vec<String> = paper_names().map(String::from).collect();
        names.sort();
        assert_eq!(names, dirs);
        for p in PAPERS {
            assert!(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(p.doc)
                    .is_file(),
                "{}: {} is missing",
                p.name,
                p.doc
            );
        }
    }

    #[test]
    fn a_path_is_not_a_paper() {
        assert!(paper("../../etc").is_none());
        assert!(!known_paper("../../etc") && !known_paper("") && !known_paper("a/b"));
        assert!(paper("did/..").is_none());
        assert!(paper("did").is_some());
    }
}
